"""A private registry as a site runs one (TLS with its own CA, htpasswd login): `invoke push` after
`docker login`, a wrong password named as such, and a pod's image pulled the way a kubelet pulls it,
with the credentials of the Secret the manifest's imagePullSecrets names."""
import base64
import json
import os
import shutil
import subprocess
import uuid

import pytest

from conftest import SESSION, SPEC, make_settings
from deploy.targets import k8s
from helpers import jobs, k8s_docker
from helpers.tls_registry import tiny_image
from runtime.spec import KubernetesOptions, spec_hash
from toolchain import pipeline
from toolchain.errors import RegistryError
from toolchain.progress import Reporter
from deploy.registry.client import CERTS_D


def _record(s, local: str, image_id: str) -> None:
    """build.json records the one-file image as the cpu build (no stages below: its layer comes from `docker save`)."""
    record = {"variant": "cpu", "local_ref": local, "human_ref": f"{SESSION}-cpu:cpu-latest-private",
              "image_id": image_id, "spec_sha256": spec_hash(SPEC), "base_ref": "-", "deps_ref": "-",
              "app_ref": "-", "torch_source": "-"}
    (s.build_dir / "build.json").write_text(json.dumps({"cpu": record}))


def test_push_with_a_login_and_pull_with_image_pull_secrets(client, private_registry, trusted_ca, tmp_path, app_dir,
                                                             monkeypatch):
    private = private_registry
    """The toolchain's own push of a recorded build (a one-file image, its layer and config taken from
    `docker save`: the push path is the same for 7 GiB), the TLS certificate verified against certs.d."""
    config = tmp_path / "docker-config"
    monkeypatch.setenv("DOCKER_CONFIG", str(config))  # the push reads the login from here, as the engine's client does
    s = make_settings(tmp_path / "w", app_dir, registry_address=private.address)
    local = f"{SESSION}-cpu:cpu-private{uuid.uuid4().hex[:8]}"
    image_id = tiny_image(client, local)
    try:
        client.api.tag(image_id, f"{SESSION}-cpu", "cpu-latest-private")
        _record(s, local, image_id)

        # without a login: refused, with the fix
        with pytest.raises(RegistryError, match="refused the credentials; run `docker login"):
            pipeline.push(s, str(SPEC), "cpu", Reporter())
        bad = private.login(config, "not-the-password")
        assert bad.returncode != 0 and "unauthorized" in bad.stderr.lower(), bad.stderr

        assert private.login(config).returncode == 0
        assert private.password not in (config / "config.json").read_text()  # base64 of user:password
        pushed = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
        assert pushed["repo_digest"].startswith(f"{private.address}/") and pushed["registry_scheme"] == "https"
        assert pushed["push"]["layers_pushed"] == 1 and pushed["push"]["bytes_compressed"] > 0
        again = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
        assert again["digest"] == pushed["digest"] and again["push"]["layers_existing"] == 1
        assert again["push"]["bytes_compressed"] == 0

        # the pod as rendered, pulled as a kubelet pulls it
        opts = KubernetesOptions(namespace="ml", fileroot_claim="shared", image_pull_secret="regcred")
        job = jobs.job(pushed["repo_digest"], name="private", nodes=1, image_info=jobs.info(pushed["repo_digest"]))
        pod = k8s.render(job, opts)[1]["spec"]["template"]["spec"]
        client.api.remove_image(image_id, force=True)  # as on a node that never had it: every pull asks the registry
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        good = k8s_docker.docker_registry_secret("regcred", "ml", private.address, private.user, private.password)
        wrong = k8s_docker.docker_registry_secret("regcred", "ml", private.address, private.user, "guess")
        with pytest.raises(k8s_docker.KubeletRefused, match="anonymous: .*(unauthorized|no basic auth)"):
            k8s_docker.pull_as_kubelet(client, pod, {})  # the Secret does not exist
        with pytest.raises(k8s_docker.KubeletRefused, match=f"with {private.user}: .*(unauthorized|authentication)"):
            k8s_docker.pull_as_kubelet(client, pod, {"regcred": wrong})
        k8s_docker.pull_as_kubelet(client, pod, {"regcred": good})
        assert client.images.get(pushed["repo_digest"]).id == image_id
    finally:
        try:
            client.api.remove_image(image_id, force=True)  # and every tag of it
        except Exception:
            pass


def test_a_certificate_the_ca_in_certs_d_did_not_sign_is_refused(client, private_registry, tmp_path, app_dir,
                                                                  monkeypatch):
    """With /etc/docker/certs.d/<host:port>/ca.crt present, the push trusts that CA and no other: the
    registry's own certificate (another CA) is refused before any credentials are sent, naming the file."""
    other = tmp_path / "other-ca"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=not it",
                    "-keyout", str(other / "ca.key"), "-out", str(other / "ca.crt")], check=True, capture_output=True)
    d = CERTS_D / private_registry.address
    d.mkdir(parents=True, exist_ok=False)
    shutil.copy(other / "ca.crt", d / "ca.crt")
    config = tmp_path / "docker-config"
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    local = f"{SESSION}-cpu:cpu-private{uuid.uuid4().hex[:8]}"
    image_id = tiny_image(client, local)
    try:
        assert private_registry.login(config).returncode == 0  # the CLI, through the engine (loopback: not verified)
        s = make_settings(tmp_path / "w", app_dir, registry_address=private_registry.address)
        _record(s, local, image_id)
        with pytest.raises(RegistryError, match=rf"TLS with {private_registry.address} failed \(certificate verify "
                                                rf"failed.*{d / 'ca.crt'}"):
            pipeline.push(s, str(SPEC), "cpu", Reporter())
        assert not (s.build_dir / "images.json").exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)
        client.api.remove_image(image_id, force=True)


def test_push_to_a_registry_that_asks_for_bearer_tokens(client, tmp_path, monkeypatch):
    """Docker Hub, Harbor and GitLab answer 401 with a Bearer challenge: the push gets a token for the
    repository from the realm with the login of the Docker config, and is refused clearly without one."""
    pytest.importorskip("cryptography")
    from helpers.small_image import cleanup_pulled, small_image
    from helpers.token_auth import TokenRegistry, TokenService
    from toolchain.publish.push import push_image
    password = uuid.uuid4().hex
    service = TokenService(tmp_path, "trainer", password)
    reg = TokenRegistry(tmp_path / "reg", service)
    img = small_image(client, tmp_path / "layers")
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))

    def login(secret: str) -> None:
        auth = base64.b64encode(f"trainer:{secret}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {reg.address: {"auth": auth}}}))

    def push():
        return push_image(client, "cpu", img.image_id, f"{reg.address}/team/raytrain-cpu", ["t"], 0, 0.1,
                          Reporter(quiet=True), 30, layer_store=img.store, blob_cache=tmp_path / "blobs",
                          candidates=[img.base_ref])
    try:
        no_login = rf"getting a token .* HTTP 401.*with no login.*docker login {reg.address}"
        with pytest.raises(RegistryError, match=no_login):
            push()
        login("not-the-password")
        with pytest.raises(RegistryError, match=r"HTTP 401.*with the login in the Docker config.*docker login"):
            push()
        login(password)
        res = push()
        assert res.layers_pushed == 2
        assert ["repository:team/raytrain-cpu:pull,push"] in service.scopes
        client.images.remove(img.image_id, force=True)
        pulled = client.images.pull(res.repo_digest.docker(), auth_config={"username": "trainer", "password": password})
        assert pulled.id == img.image_id
    finally:
        img.remove(client)
        reg.stop()
        service.close()
        cleanup_pulled(client, reg.address)


def test_logins_are_read_as_the_docker_cli_stores_them(tmp_path, monkeypatch):
    """auths (any spelling of the host), a credHelpers entry for the host, a credsStore: the helper
    program is run with the host on stdin, as the Docker CLI runs it."""
    from deploy.registry.auth import credentials
    bin_dir, config = tmp_path / "bin", tmp_path / "docker-config"
    bin_dir.mkdir()
    config.mkdir()
    helper = bin_dir / "docker-credential-raytraintest"
    helper.write_text('#!/bin/sh\nread host\nif [ "$1 $host" = "get reg.example.com:5000" ]; then\n'
                      '  echo \'{"ServerURL":"reg.example.com:5000","Username":"robot","Secret":"s3cret"}\'\n'
                      'else\n  echo "credentials not found in native keychain"; exit 1\nfi\n')
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CONFIG", str(config))

    def cfg(doc) -> None:
        (config / "config.json").write_text(json.dumps(doc))
    assert credentials("reg.example.com:5000") is None  # no config file at all
    cfg({"auths": {"https://reg.example.com:5000/v1/": {"auth": base64.b64encode(b"me:pw:with:colons").decode()}}})
    assert credentials("reg.example.com:5000") == ("me", "pw:with:colons")
    assert credentials("other.example.com") is None
    cfg({"credHelpers": {"reg.example.com:5000": "raytraintest"}})
    assert credentials("reg.example.com:5000") == ("robot", "s3cret")
    cfg({"credsStore": "raytraintest"})
    assert credentials("reg.example.com:5000") == ("robot", "s3cret")
    assert credentials("other.example.com") is None  # the helper's "not found"
    cfg({"credsStore": "not-installed-here"})
    with pytest.raises(RegistryError, match="docker-credential-not-installed-here is not on PATH"):
        credentials("reg.example.com:5000")
    (config / "config.json").write_text("{broken")
    with pytest.raises(RegistryError, match=f"{config / 'config.json'}: not readable as the Docker config"):
        credentials("reg.example.com:5000")


def test_a_docker_config_that_is_no_bounded_file_is_one_line_at_once(tmp_path, monkeypatch):
    """A FIFO (nobody writes it), a link to /dev/zero, a file past the bound, JSON nested past the parser's
    depth: each is a RegistryError naming the file within a second, never a hang, a MemoryError or a traceback."""
    import time
    from deploy.registry import auth
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    path = tmp_path / "config.json"

    def refused(says: str) -> None:
        t0 = time.monotonic()
        with pytest.raises(RegistryError, match=f"{path}: .*{says}"):
            auth.credentials("reg.example.com:5000")
        assert time.monotonic() - t0 < 1
        path.unlink()
    os.mkfifo(path)
    refused("the Docker config is not a regular file")
    path.symlink_to("/dev/zero")
    refused("the Docker config is not a regular file")
    path.write_bytes(b" " * (auth.MAX_DOCKER_CONFIG + 1))
    refused(f"is {auth.MAX_DOCKER_CONFIG + 1} bytes, more than the {auth.MAX_DOCKER_CONFIG}")
    path.write_text("[" * 200_000 + "]" * 200_000)
    refused("not readable as the Docker config")


def test_a_credential_helper_is_bounded_in_time_and_output(tmp_path, monkeypatch):
    """A helper that never answers is cut at the bound given; one that prints without end is stopped at
    MAX_HELPER_OUTPUT: each is one RegistryError naming the helper, within seconds, memory flat."""
    import time
    from deploy.registry import auth
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sleepy", "sleep 30"), ("chatty", "yes '{\"Username\": \"x\"}'")):
        helper = bin_dir / f"docker-credential-{name}"
        helper.write_text(f"#!/bin/sh\n{body}\n")
        helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "sleepy"}))
    t0 = time.monotonic()
    with pytest.raises(RegistryError, match="docker-credential-sleepy get did not answer within 1 s"):
        auth.credentials("reg.example.com:5000", timeout_s=1.0)
    assert time.monotonic() - t0 < 5
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "chatty"}))
    t0 = time.monotonic()
    with pytest.raises(RegistryError, match=f"docker-credential-chatty get printed more than {auth.MAX_HELPER_OUTPUT}"):
        auth.credentials("reg.example.com:5000", timeout_s=10.0)
    assert time.monotonic() - t0 < 5

"""Pre-flight at --submit asks the registry for the pinned manifest: a registry that is down, one
that refuses the login, and one without the digest are each named, against real registries."""
import json

from deploy import registry_check
from helpers.tls_registry import tiny_image
from runtime.imageref import ImageRef

MISSING = "sha256:" + "0" * 64


def test_down_unauthorized_unknown_and_present(client, private_registry, tmp_path):
    private = private_registry
    config = tmp_path / "docker-config"
    env = {"DOCKER_CONFIG": str(config), "HOME": str(tmp_path)}
    down = registry_check.check(ImageRef.parse(f"127.0.0.1:1/raytrain-cpu@{MISSING}"), "https", None, timeout_s=3)
    assert "registry 127.0.0.1:1 is unreachable from here" in down and "deploy without --submit" in down

    ref = ImageRef.parse(f"{private.address}/tiny@{MISSING}")
    assert registry_check.docker_credentials(private.address, env) is None
    anonymous = registry_check.check(ref, "https", None)
    assert "answered 401 without credentials" in anonymous and f"docker login {private.address}" in anonymous
    assert "http1.1" in anonymous  # enroot's HTTP/2 basic-auth note
    wrong = registry_check.check(ref, "https", (private.user, "guess"))
    assert "answered 401 with the credentials of `docker login" in wrong

    login = private.login(config)
    assert login.returncode == 0, login.stderr
    creds = registry_check.docker_credentials(private.address, env)
    assert creds == (private.user, private.password)
    unknown = registry_check.check(ref, "https", creds)
    assert f"has no manifest {MISSING} in tiny (manifest unknown)" in unknown and "invoke push" in unknown

    local = f"{private.address}/tiny:v1"
    tiny_image(client, local)
    try:
        pushed = client.api.push(local.rsplit(":", 1)[0], tag="v1", auth_config={"username": private.user,
                                                                                  "password": private.password})
        digest = next(json.loads(l)["aux"]["Digest"] for l in pushed.splitlines() if '"aux"' in l)
        assert registry_check.check(ImageRef.parse(f"{private.address}/tiny@{digest}"), "https", creds) is None
    finally:
        client.api.remove_image(local, force=True)

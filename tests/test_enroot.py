"""The .sqsh converter against real Docker, mksquashfs and unsquashfs; then the image is booted.

Format: a fixture image full of the cases enroot handles specially (tests/helpers/enroot_fixture.py)
is converted and compared with facts recorded from a real `enroot import dockerd://` of the same
image (tests/data/enroot_import_facts.json): superblock options, root mode, every entry's type,
mode, owner and symlink target (a non-ASCII absolute link among them), the permission fix-up,
and the four configuration files. A small image on the bootstrapped base checks /etc/rc's
behaviour; the cpu image is started the way enroot starts a conversion of it, with the configuration
files the conversion writes (the incremental conversion, what `deploy --target pyxis --sqsh` does after
a build, is tests/test_enroot_incremental.py's, entry for entry against a full one).
"""
import io
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from deploy.targets.pyxis import enroot, sqsh
from helpers import enroot_fixture
from toolchain.image.bootstrap import ensure_base
from toolchain.progress import Reporter

CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
FACTS = Path(__file__).parent / "data" / "enroot_import_facts.json"


def read_member(path, member) -> str:
    return enroot_fixture.read_member(str(path), member)


@pytest.fixture(scope="module")
def small_image(client, settings):
    base = ensure_base(client, settings, Reporter(quiet=True)).ref
    marker = uuid.uuid4().hex[:8]
    dockerfile = f"""FROM {base}
LABEL io.raytrain.test="{marker}"
ENV GREETING="hello world" RAYTRAIN_MARK={marker}
RUN mkdir -p /srv/app && echo hi > /srv/app/owned && chown 1000:1000 /srv/app/owned && touch /.dockerenv
WORKDIR /srv/app
VOLUME /data
ENTRYPOINT ["/bin/echo", "it's"]
CMD ["a", "$HOME"]
"""
    img, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"raytrain-sqsh-test:{marker}", rm=True)
    yield img
    client.images.remove(img.id, force=True)


@pytest.fixture(scope="module")
def fixture_image(client):
    tag = enroot_fixture.build(client)
    yield tag
    client.images.remove(tag, force=True)


def test_sqsh_matches_a_real_enroot_import(client, fixture_image, tmp_path):
    recorded = json.loads(FACTS.read_text())
    res = sqsh.convert(client, fixture_image, tmp_path)
    ours = enroot_fixture.facts(str(res.path))
    assert ours["superblock"] == recorded["superblock"]
    assert ours["files"] == recorded["files"]
    assert ours["listing"]["/"] == recorded["listing"]["/"] == ["drwxr-xr-x", "0/0", ""]
    link = f"/etc/ssl/certs/{enroot_fixture.NON_ASCII}.pem"
    assert ours["listing"][link][2] == f"/usr/share/ca-certificates/{enroot_fixture.NON_ASCII}.crt"
    assert ours["listing"]["/opt/noread"][0] == "-r--------" and ours["listing"]["/opt/locked"][0] == "drwx------"
    assert ours["listing"] == recorded["listing"]


def _dangling_volumes(client) -> set:
    return {v.id for v in client.volumes.list(filters={"dangling": True})}


def test_rc_script_behaviour(client, small_image, tmp_path):
    before = _dangling_volumes(client)
    res = sqsh.convert(client, small_image.tags[0], tmp_path)
    # the container it exported is gone with the anonymous volume the image's VOLUME /data made
    assert not _dangling_volumes(client) - before
    assert not res.cached and res.path.name.endswith(small_image.id.replace(":", "-") + ".sqsh")
    env = read_member(res.path, "etc/environment").splitlines()
    assert "GREETING=hello world" in env and any(l.startswith("PATH=") for l in env)
    assert read_member(res.path, "etc/fstab") == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    rc = read_member(res.path, "etc/rc")
    assert f"# io.raytrain.test {small_image.labels['io.raytrain.test']}" in rc
    assert 'cd "/srv/app" && unset OLDPWD || exit 1' in rc  # enroot's own quoting (bash ${word@Q})
    assert "exec '/bin/echo' 'it'\\''s' \"$@\"" in rc and "exec '/bin/echo' 'it'\\''s' 'a' '$HOME'" in rc

    # the rc script does what enroot start would: default command, then a given one
    tree = tmp_path / "tree"
    enroot_fixture.unsquash(res.path, tree)
    out = subprocess.run([CHROOT, str(tree), "/bin/sh", "/etc/rc"], capture_output=True, text=True, env={}).stdout
    assert out == "it's a $HOME\n"
    out = subprocess.run([CHROOT, str(tree), "/bin/sh", "/etc/rc", "pwd:", "$(x)"], capture_output=True, text=True).stdout
    assert out == "it's pwd: $(x)\n"

    again = sqsh.convert(client, small_image.tags[0], tmp_path)
    assert again.cached and again.path == res.path and again.seconds < 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work dirs left behind


@pytest.fixture(scope="module")
def cpu_as_enroot_starts_it(client, built, tmp_path_factory):
    """The cpu image with the configuration files a conversion writes into it (enroot.config_files: /etc/rc,
    /etc/environment, ...) laid over it, and a start like enroot's: /etc/rc through a login shell, the
    environment from /etc/environment (plus HOME and TERM, as enroot's login sets them), any uid. In the
    engine, with the files bind-mounted: no 7 GB tree and .sqsh beside the session's images (the
    conversion's output is checked entry for entry on images made for each case, test_enroot_incremental.py;
    its split of this image's layers, test_layer_cache.py)."""
    image = client.images.get(built["cpu"]["local_ref"])
    config = image.attrs["Config"]
    work = tmp_path_factory.mktemp("cpu-enroot")
    mounts = {}
    for rel, text in enroot.config_files(config).items():
        (work / rel.replace("/", "_")).write_text(text)
        mounts[str(work / rel.replace("/", "_"))] = {"bind": f"/{rel}", "mode": "ro"}
    env = [l for l in enroot.config_files(config)["etc/environment"].splitlines() if "=" in l] + ["HOME=/", "TERM=dumb"]

    def start(user: str, shell: str, *argv: str) -> tuple[int, str]:
        c = client.containers.run(image.id, [shell, "-l", "/etc/rc", *argv], entrypoint=[], user=user,
                                  environment=env, volumes=mounts, working_dir=config.get("WorkingDir") or "/",
                                  detach=True)
        try:
            code = c.wait(timeout=300)["StatusCode"]
            return code, c.logs(stdout=True, stderr=False).decode() + "\n" + c.logs(stdout=False, stderr=True).decode()
        finally:
            c.remove(force=True)
    yield start
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("user,shell", [("0:0", "/bin/sh"), ("1000:1000", "/bin/bash"), ("4242:4242", "/bin/sh")],
                         ids=["root", "image-user-bash", "unknown-uid"])
def test_cpu_image_boots_like_enroot_under_a_login_shell(cpu_as_enroot_starts_it, user, shell):
    start = cpu_as_enroot_starts_it
    code, out = start(user, shell, "python", "-m", "runtime", "selfcheck")
    assert code == 0, out[-2000:]
    report = json.loads(next(l for l in reversed(out.splitlines()) if l.startswith("{")))
    assert report["cluster_spec_path"] and report["cluster_name"]
    assert report["torch"].startswith("2.9.1") and report["ray"] == "2.60.0"
    assert report["uid"] == int(user.split(":")[0])
    code, out = start(user, shell, "ray", "--version")
    assert code == 0 and "2.60.0" in out, out[-2000:]
    # the login shell did reset PATH, and the image put its venv back first
    code, out = start(user, shell, "/bin/sh", "-c", "command -v python; command -v ray")
    assert out.split()[:2] == ["/opt/venv/bin/python", "/opt/venv/bin/ray"], out


def test_rc_script_without_an_entrypoint_is_enroots_byte_for_byte():
    """Seen on a real enroot 4.1.2 import of the cpu image (no Entrypoint, Cmd python -m runtime
    selfcheck): the empty entrypoint still leaves its space after `exec`."""
    rc = enroot.rc_script({"WorkingDir": "/app/project", "Cmd": ["python", "-m", "runtime", "selfcheck"]})
    assert '    exec  "$@"\n' in rc
    assert "    exec  'python' '-m' 'runtime' 'selfcheck'\n" in rc


def test_a_cached_sqsh_needs_no_docker_engine(tmp_path, monkeypatch):
    """A login node without Docker: the .sqsh made earlier for this digest is used; making one names the
    engine as what is missing."""
    from deploy.job import DeployError
    from toolchain.docker_client import engine
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")  # the engine, unreachable
    image, digest = "registry.example.com/raytrain-cpu:abc", "sha256:" + "1f" * 32
    cached = tmp_path / enroot.sqsh_name(image, digest)
    cached.write_bytes(b"hsqs")
    res = sqsh.convert(engine, image, tmp_path, digest=digest)
    assert res.cached and res.path == cached
    cached.unlink()
    with pytest.raises(DeployError, match=r"needs the Docker engine, and cannot reach the Docker engine .*"
                                          r"the file is then cached"):
        sqsh.convert(engine, image, tmp_path, digest=digest)
    assert list(tmp_path.iterdir()) == []


def test_a_user_without_docker_access_deploys_a_cached_sqsh():
    """As a login node's user: uid 4242, not in the docker group, so the engine's socket refuses it."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    home = Path(tempfile.mkdtemp(prefix="raytrain-nodocker-", dir="/tmp"))  # pytest's own tmp is root-only
    home.chmod(0o755)
    image, digest = "registry.example.com/raytrain-cpu:abc", "sha256:" + "2e" * 32
    (home / enroot.sqsh_name(image, digest)).write_bytes(b"hsqs")
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
            "from deploy.targets.pyxis import enroot, sqsh\nfrom toolchain.docker_client import engine\n"
            f"res = sqsh.convert(engine, {image!r}, {str(home)!r}, digest={digest!r})\n"
            "print('cached' if res.cached else 'made', res.path)\n"
            f"sqsh.convert(engine, {image!r}, {str(home)!r}, digest='sha256:' + '3f' * 32)\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    try:
        res = subprocess.run(["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", sys.executable, "-c", code],
                             capture_output=True, text=True, env=env, timeout=60)
        assert res.stdout.startswith("cached "), res.stderr[-2000:]
        # another digest must be made: the engine is named as what is missing, with the socket's own refusal
        assert "needs the Docker engine, and cannot reach the Docker engine" in res.stderr, res.stderr[-2000:]
        assert "Permission denied" in res.stderr
        assert [p.name for p in home.iterdir()] == [enroot.sqsh_name(image, digest)]
    finally:
        shutil.rmtree(home, ignore_errors=True)

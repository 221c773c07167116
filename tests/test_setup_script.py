"""scripts/setup.sh --light for an ordinary user (a login node): no sudo when its tools are there (sbin
included, which such a user's PATH lacks), the packages to ask for when one is missing, and the Docker
socket's permission said as such. Run as `nobody` in a copy of the script, its venv's pip a stand-in
(the installs are not what is tested here)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the script as another user")


@pytest.fixture
def tmp_path():
    """pytest's own tmp_path is under a directory only root may enter; this one `nobody` can."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="raytrain-setup-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def project(tmp_path: Path, tools: dict[str, bool]) -> tuple[Path, Path]:
    """A copy of the script with a venv whose pip is a stand-in, and a bin directory for PATH with the
    system's basic tools and a stand-in for each of TOOLS that is present; (project, bin directory)."""
    proj = tmp_path / "proj"
    (proj / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", proj / "scripts" / "setup.sh")
    venv_bin = proj / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to("/usr/bin/python3")  # one `nobody` can run
    (venv_bin / "pip").write_text("#!/bin/sh\necho \"pip $*\" >> \"$(dirname \"$0\")/../pip.log\"\n")
    (venv_bin / "pip").chmod(0o755)
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    for name in ("id", "sed", "dirname", "cat", "sh", "bash", "python3"):  # the system's, not root's pyenv
        found = shutil.which(name, path="/usr/bin:/bin")
        if found:
            (path_dir / name).symlink_to(found)
    (path_dir / "sudo").write_text("#!/bin/sh\necho SUDO-CALLED >&2\nexit 99\n")
    (path_dir / "sudo").chmod(0o755)
    for name, present in tools.items():
        if present:
            (path_dir / name).write_text("#!/bin/sh\nexit 0\n")
            (path_dir / name).chmod(0o755)
    for p in (tmp_path, proj, proj / ".venv", venv_bin, proj / "scripts", path_dir):
        os.chown(p, NOBODY, NOBODY)
    (proj / ".venv").chmod(0o777)
    return proj, path_dir


def run_as_nobody(proj: Path, path_dir: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(path_dir), "HOME": str(proj)}
    return subprocess.run([shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           str(shutil.which("bash")), "scripts/setup.sh", "--light"],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=120)


def test_light_setup_as_an_ordinary_user_needs_no_sudo_when_the_tools_are_there(tmp_path):
    proj, path_dir = project(tmp_path, {"mksquashfs": True})
    res = run_as_nobody(proj, path_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUDO-CALLED" not in res.stderr and "installing" not in res.stdout
    assert "setup: ready (.venv, light" in res.stdout
    assert "pip install -q -e ." in (proj / ".venv" / "pip.log").read_text()


def test_light_setup_names_the_missing_package_and_exits_1(tmp_path):
    proj, path_dir = project(tmp_path, {"mksquashfs": False})
    if any(Path(d, "mksquashfs").exists() for d in ("/usr/sbin", "/sbin", "/usr/local/sbin")):
        pytest.skip("mksquashfs is in an sbin directory here: the script finds it there (as it should)")
    res = run_as_nobody(proj, path_dir)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "missing squashfs-tools; ask an administrator to install them" in res.stderr
    assert "SUDO-CALLED" not in res.stderr and not (proj / ".venv" / "pip.log").exists()


def test_a_tool_in_sbin_counts_though_the_user_s_path_lacks_it(tmp_path):
    """debootstrap and friends live in /usr/sbin, off an ordinary user's PATH: found there, not reinstalled."""
    sbin = [d for d in ("/usr/sbin", "/sbin") if Path(d, "mksquashfs").exists() or Path(d).is_dir()]
    proj, path_dir = project(tmp_path, {"mksquashfs": False})
    script = (proj / "scripts" / "setup.sh").read_text()
    # the same check with a tool that is in /usr/sbin on every Debian (and not on the stand-in PATH)
    (proj / "scripts" / "setup.sh").write_text(script.replace('tools="mksquashfs:squashfs-tools"',
                                                              'tools="useradd:passwd"'))
    assert sbin and Path("/usr/sbin/useradd").exists()
    res = run_as_nobody(proj, path_dir)
    assert res.returncode == 0 and "missing" not in res.stderr, res.stdout + res.stderr


def test_the_toolchain_says_a_socket_it_may_not_open_is_a_permission_problem(tmp_path):
    """Not `start dockerd`: the engine runs, the user is not in its group. Run as `nobody` with the
    system's Python and a copy of the modules it needs, against this machine's real socket."""
    import docker
    socket = Path("/var/run/docker.sock")
    if not socket.exists() or socket.stat().st_mode & 0o006:
        pytest.skip("needs the engine's socket, closed to other users")
    site = Path(docker.__file__).parent.parent
    lib = tmp_path / "lib"
    for pkg in ("docker", "requests", "urllib3", "idna", "certifi", "charset_normalizer"):
        shutil.copytree(site / pkg, lib / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in ("toolchain", "deploy", "runtime"):
        shutil.copytree(ROOT / pkg, lib / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)
    code = "from toolchain.docker_client import engine\nengine()"
    res = subprocess.run(["/usr/bin/python3", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "HOME": str(tmp_path)},
                         user=NOBODY, group=NOBODY, extra_groups=[])
    assert res.returncode == 1, res.stderr
    said = res.stderr.strip().splitlines()[-1]
    assert "Permission denied: the engine runs, but nobody may not open its socket" in said, said
    assert "`docker` group" in said, said
    assert "start dockerd" not in said

"""The local registry: Debian's docker-registry (CNCF distribution) on loopback, data in the project."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.registry.address import is_local, ping
from toolchain.publish.blobs import Blob
from runtime.files import read_regular
from toolchain.config import Settings
from toolchain.atomic import write_atomic
from toolchain.errors import RegistryError
from runtime.wait import WaitTimeout, holds_within, wait_until
from toolchain.progress import Reporter



@dataclass(frozen=True)
class RegistryStatus:
    address: str
    reachable: bool
    started_here: bool
    pid: int | None




def _paths(settings: Settings) -> tuple[Path, Path, Path]:
    data = settings.path(settings.registry.data_dir)
    return data, data / "config.yml", data / "registry.pid"


def start_local(settings: Settings, rep: Reporter, timeout: float = 30.0) -> RegistryStatus:
    address = settings.registry.address
    if ping(address):
        return RegistryStatus(address, True, False, _read_pid(settings))
    if not is_local(address):
        raise RegistryError(f"registry {address} is not answering on /v2/; check the address (registry.address) and that it is up")
    if not settings.registry.start_local:
        raise RegistryError(f"local registry {address} is not running and registry.start_local is false; start it or enable start_local")
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        raise RegistryError("no registry binary found; run `apt-get install docker-registry` (Debian) or point registry.address at a running registry")
    data, config, pidfile = _paths(settings)
    (data / "storage").mkdir(parents=True, exist_ok=True)
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {(data / 'storage').resolve()}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address.split('/')[0]}\n"
    )
    log = open(data / "registry.log", "ab")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    write_atomic(pidfile, str(proc.pid))
    rep.step(f"registry: started {binary} on {address} (pid {proc.pid}, data in {data})")
    def log_tail() -> str:
        return " | ".join((data / "registry.log").read_text(errors="replace").strip().splitlines()[-5:])

    def up() -> bool:
        if proc.poll() is not None:
            raise RegistryError(f"the local registry exited with {proc.returncode}: {log_tail()}")
        return ping(address, timeout=0.5)
    try:
        wait_until(up, timeout_s=timeout, what=f"the local registry to answer on {address}",
                   hint=f"see {data / 'registry.log'}", logs=log_tail)
    except WaitTimeout as e:
        raise RegistryError(str(e)) from None
    return RegistryStatus(address, True, True, proc.pid)


def _read_pid(settings: Settings) -> int | None:
    """The pid registry.pid names: a whole number above 1 (never 0, -1 or a group), else None."""
    _, _, pidfile = _paths(settings)
    try:
        text = read_regular(pidfile, 64, follow=False).decode(errors="replace").strip()
    except OSError:  # none, or a link, a FIFO or a long file: not the pid file registry.start writes
        return None
    return int(text) if text.isascii() and text.isdigit() and 1 < int(text) < 1 << 22 else None


def _is_ours(pid: int, config: Path) -> bool:
    """Whether PID is the registry this project started: `<docker-registry> serve <this config>`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return False
    return (len(argv) == 3 and os.path.basename(argv[0]) in (b"docker-registry", b"registry")
            and argv[1] == b"serve" and argv[2] == str(config).encode())


def stop_local(settings: Settings) -> bool:
    """Stop the registry this project started (registry.pid), and only that process: a pid file naming
    any other process (reused, or written by someone else) is removed without a signal."""
    pid = _read_pid(settings)
    _, config, pidfile = _paths(settings)
    if pid is None or not _is_ours(pid, config):
        pidfile.unlink(missing_ok=True)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return False
    def gone() -> bool:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    if not holds_within(gone, timeout_s=5, interval_s=0.1, what=f"the registry (pid {pid}) to stop"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pidfile.unlink(missing_ok=True)
    return True


def status(settings: Settings) -> RegistryStatus:
    return RegistryStatus(settings.registry.address, ping(settings.registry.address), False, _read_pid(settings))


def blob_storage(settings: Settings) -> Path:
    """Where the local registry this tool runs keeps its blobs' files (distribution's filesystem layout)."""
    return _paths(settings)[0] / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256"


def share_blob(blob: Blob, storage: Path) -> int:
    """Store a cached blob once with the local registry's copy of it: the cache's file becomes a hard link
    to the registry's. The registry this tool runs keeps its data beside the project, and the two copies
    are the same bytes (named by their sha256, checked by the registry when it took them, and never
    changed in place by either); the example's image is 4 GB of blobs. The bytes saved."""
    theirs = storage / blob.digest.hex[:2] / blob.digest.hex / "data"
    try:
        mine, st = blob.path.stat(), theirs.stat()
    except OSError:
        return 0
    if (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino) or mine.st_dev != st.st_dev or st.st_size != blob.size:
        return 0
    tmp = blob.path.with_name(f".{blob.path.name}.{os.getpid()}.link")
    try:
        os.link(theirs, tmp)
        os.replace(tmp, blob.path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return 0
    return blob.size

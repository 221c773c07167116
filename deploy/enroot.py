"""An enroot squashfs (.sqsh) from a local image, without enroot.

Same format contract as `enroot import dockerd://IMAGE`: the image's flattened filesystem
(`docker export` minus `dev/*` and `.dockerenv`), plus
  /etc/environment  the image's Env, one NAME=value per line;
  /etc/rc           labels as comments, `cd` to WorkingDir, source /etc/rc.local, then exec
                    Entrypoint + (the arguments given to `enroot start`, or Cmd);
  /etc/fstab        one bind line per image Volume;
  /etc/rc.local     an empty hook;
all files owned by root, squashed with enroot's default options (`-comp lzo -noD`).
With `sqfstar` installed the export is filtered as a tar stream straight into it (no extracted
copy on disk); otherwise it is extracted to a scratch directory and `mksquashfs` runs on that.
The output is named by the image digest and cached: a second conversion costs one stat().
"""
from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from deploy.job import DeployError

ENROOT_DEFAULT_OPTIONS = ("-comp", "lzo", "-noD")
EXCLUDES = ("--exclude=dev/*", "--exclude=.dockerenv")


@dataclass(frozen=True)
class SquashResult:
    path: Path
    cached: bool
    seconds: float
    export_seconds: float = 0.0
    squash_seconds: float = 0.0


def sqsh_name(repo: str, digest: str) -> str:
    """'host:5000/raytrain-cpu' + 'sha256:ab..' -> 'raytrain-cpu+sha256-ab...sqsh' (no '@' or ':' for Pyxis)."""
    base = repo.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    return f"{base}+{digest.replace(':', '-')}.sqsh"


def rc_script(config: dict) -> str:
    labels = config.get("Labels") or {}
    workdir = config.get("WorkingDir") or "/"
    entry = list(config.get("Entrypoint") or [])
    cmd = list(config.get("Cmd") or [])
    if not entry and not cmd:
        cmd = ["/bin/sh"]
    lines = [f"# {k} {v}".replace("\n", " ") for k, v in sorted(labels.items())]
    if lines:
        lines.append("")
    q = shlex.join
    lines += [f"mkdir -p {shlex.quote(workdir)} 2> /dev/null",
              f"cd {shlex.quote(workdir)} && unset OLDPWD || exit 1",
              "",
              "if [ -s /etc/rc.local ]; then",
              "    . /etc/rc.local",
              "fi",
              "",
              "if [ $# -gt 0 ]; then",
              f"    exec {q(entry) + ' ' if entry else ''}\"$@\"",
              "else",
              f"    exec {q(entry + cmd)}",
              "fi", ""]
    return "\n".join(lines)


RC_LOCAL = ("# This file is sourced by /etc/rc when the container starts.\n"
            "# It can be used to manipulate the entrypoint or the command of the container.\n")


def config_files(config: dict) -> dict[str, str]:
    """The enroot configuration files, path (relative to /) -> content."""
    return {
        "etc/environment": "".join(f"{e}\n" for e in config.get("Env") or []),
        "etc/fstab": "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                             for v in sorted(config.get("Volumes") or {})),
        "etc/rc": rc_script(config),
        "etc/rc.local": RC_LOCAL,
    }


def configure(rootfs: Path, config: dict) -> None:
    """Write the configuration files into an extracted tree (the mksquashfs path)."""
    (rootfs / "etc").mkdir(parents=True, exist_ok=True)
    for rel, text in config_files(config).items():
        target = rootfs / rel
        if target.is_symlink():
            target.unlink()  # never write through a link into the host
        target.write_text(text)
    workdir = (config.get("WorkingDir") or "/").lstrip("/")
    (rootfs / workdir).mkdir(parents=True, exist_ok=True)


@contextmanager
def exported(client, image_id: str) -> Iterator[Iterator[bytes]]:
    """`docker export` chunks of a created (never started) container of the image; removed afterwards."""
    container = client.containers.create(image_id, command=["true"], entrypoint=[])
    try:
        yield container.export(chunk_size=4 << 20)
    finally:
        container.remove(force=True)


def _throttled(progress, every_s: float, what: str) -> Callable[[int], None]:
    """A bytes-so-far callback that reports through `progress` at most every `every_s` seconds."""
    last = [time.monotonic()]

    def tick(total: int) -> None:
        if progress and time.monotonic() - last[0] > every_s:
            progress(f"{what}: {total / 2**30:.2f} GiB")
            last[0] = time.monotonic()
    return tick


def export_rootfs(client, image_id: str, rootfs: Path, progress=None) -> int:
    """Stream the image's export into tar -x (minus dev/* and .dockerenv); returns bytes read."""
    total, tick = 0, _throttled(progress, 5, "export")
    with exported(client, image_id) as chunks:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--warning=no-timestamp", "--anchored", *EXCLUDES, "-px"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            for chunk in chunks:
                tar.stdin.write(chunk)
                total += len(chunk)
                tick(total)
        finally:
            tar.stdin.close()
            err = tar.stderr.read().decode(errors="replace")
            if tar.wait() != 0:
                raise DeployError(f"extracting the image export failed: {err.strip()[-500:]}")
    return total


def mksquashfs(rootfs: Path, out: Path, options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, quiet: bool = True) -> None:
    if shutil.which("mksquashfs") is None:
        raise DeployError("mksquashfs is not installed (Debian: squashfs-tools); run scripts/setup.sh")
    argv = ["mksquashfs", str(rootfs), str(out), "-all-root", "-noappend", "-processors", str(os.cpu_count() or 1),
            *options]
    if quiet:
        argv.append("-no-progress")
    res = subprocess.run(argv, stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise DeployError(f"mksquashfs failed ({res.returncode}): {res.stderr.strip()[-500:]}")


class _ChunkReader(io.RawIOBase):
    """A file object over docker-py's export chunks (tarfile reads the stream through it)."""

    def __init__(self, chunks, on_bytes=None):
        self.chunks, self.buf, self.total, self.on_bytes = iter(chunks), b"", 0, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf:
            self.buf = next(self.chunks, b"")
            if not self.buf:
                return 0
            self.total += len(self.buf)
            if self.on_bytes:
                self.on_bytes(self.total)
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def _excluded(name: str) -> bool:
    name = name.removeprefix("./")
    return name.startswith("dev/") or name == ".dockerenv"


def stream_to_sqfstar(client, image_id: str, config: dict, out: Path,
                      options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, progress=None) -> None:
    """docker export -> filter (dev/*, .dockerenv, the enroot files) + the enroot files -> sqfstar.

    No extracted copy of the image ever touches the disk: sqfstar reads the tar on its stdin.
    """
    argv = ["sqfstar", "-all-root", "-processors", str(os.cpu_count() or 1), "-no-progress", *options, str(out)]
    files = config_files(config)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with exported(client, image_id) as chunks:
            _filter_into(chunks, proc.stdin, config, files, _throttled(progress, 10, "squashing, read"))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    finally:
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait()
    if code != 0:
        raise DeployError(f"sqfstar failed ({code}): {err.strip()[-500:]}")


def _filter_into(chunks, sink, config: dict, files: dict[str, str], tick) -> None:
    """Copy the export's tar to `sink` without dev/*, .dockerenv and the enroot files; then add those."""
    src = io.BufferedReader(_ChunkReader(chunks, tick), buffer_size=4 << 20)
    seen = set()
    with tarfile.open(fileobj=src, mode="r|") as tin, \
            tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=4 << 20) as tout:
        tout.copybufsize = 4 << 20
        for m in tin:
            name = m.name.removeprefix("./").rstrip("/")
            if _excluded(m.name) or name in files:
                continue
            seen.add(name)
            tout.addfile(m, tin.extractfile(m) if m.isreg() else None)
        workdir = (config.get("WorkingDir") or "/").strip("/")
        parts = workdir.split("/") if workdir else []
        for i in range(len(parts)):
            d = "/".join(parts[:i + 1])
            if d not in seen:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tout.addfile(info)
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o755 if rel == "etc/rc" else 0o644, int(time.time())
            tout.addfile(info, io.BytesIO(data))


def convert(client, image: str, out_dir: Path, *, digest: Optional[str] = None,
            options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, progress=None, stream: Optional[bool] = None) -> SquashResult:
    """The image (any local reference) as OUT_DIR/<repo>+<digest>.sqsh; reused when it exists.

    stream=None: through sqfstar when installed (no extracted tree on disk), else export + mksquashfs.
    """
    t0 = time.monotonic()
    try:
        img = client.images.get(image)
    except Exception as e:
        raise DeployError(f"image {image!r} is not in the local engine ({e}); run `invoke build` (or pull it) first") from None
    out = Path(out_dir) / sqsh_name(image, digest or img.id)
    if out.exists():
        return SquashResult(out, True, time.monotonic() - t0)
    if stream is None:
        stream = shutil.which("sqfstar") is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    config = img.attrs.get("Config") or {}
    try:
        partial = work / "image.sqsh"
        if progress:
            progress(f"converting {image} ({img.attrs.get('Size', 0) / 2**30:.2f} GiB, {' '.join(options)}, "
                     f"{'streamed to sqfstar' if stream else 'extracted, then mksquashfs'}) -> {out.name}")
        if stream:
            stream_to_sqfstar(client, img.id, config, partial, options, progress)
            t1 = t2 = time.monotonic()
        else:
            rootfs = work / "rootfs"
            rootfs.mkdir()
            export_rootfs(client, img.id, rootfs, progress)
            configure(rootfs, config)
            t1 = time.monotonic()
            mksquashfs(rootfs, partial, options)
            t2 = time.monotonic()
        os.replace(partial, out)  # same filesystem: the .sqsh appears whole or not at all
        return SquashResult(out, False, time.monotonic() - t0, t1 - t0, t2 - t1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

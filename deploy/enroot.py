"""An enroot squashfs (.sqsh) from a local image, without enroot.

Same format contract as `enroot import dockerd://IMAGE`: the image's flattened filesystem
(`docker export` minus `dev/*` and `.dockerenv`), plus
  /etc/environment  the image's Env, one NAME=value per line;
  /etc/rc           labels as comments, `cd` to WorkingDir, source /etc/rc.local, then exec
                    Entrypoint + (the arguments given to `enroot start`, or Cmd);
  /etc/fstab        one bind line per image Volume;
  /etc/rc.local     an empty hook;
all files owned by root, squashed with enroot's default options (`-comp lzo -noD`).
The output is named by the image digest and cached: a second conversion costs one stat().
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

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


def configure(rootfs: Path, config: dict) -> None:
    etc = rootfs / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for name in ("rc", "rc.local", "environment", "fstab"):
        if (etc / name).is_symlink():
            (etc / name).unlink()  # never write through a link into the host
    (etc / "environment").write_text("".join(f"{e}\n" for e in config.get("Env") or []))
    (etc / "fstab").write_text("".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                                       for v in sorted(config.get("Volumes") or {})))
    (etc / "rc").write_text(rc_script(config))
    (etc / "rc.local").write_text("# This file is sourced by /etc/rc when the container starts.\n"
                                  "# It can be used to manipulate the entrypoint or the command of the container.\n")
    workdir = (config.get("WorkingDir") or "/").lstrip("/")
    (rootfs / workdir).mkdir(parents=True, exist_ok=True)


def export_rootfs(client, image_id: str, rootfs: Path, progress=None) -> int:
    """Stream `docker export` of a created (never started) container into tar -x; returns bytes read."""
    container = client.containers.create(image_id, command=["true"], entrypoint=[])
    total = 0
    try:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--warning=no-timestamp", "--anchored", *EXCLUDES, "-px"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        last = time.monotonic()
        try:
            for chunk in container.export(chunk_size=4 << 20):
                tar.stdin.write(chunk)
                total += len(chunk)
                if progress and time.monotonic() - last > 5:
                    progress(f"export: {total / 2**30:.2f} GiB")
                    last = time.monotonic()
        finally:
            tar.stdin.close()
            err = tar.stderr.read().decode(errors="replace")
            if tar.wait() != 0:
                raise DeployError(f"extracting the image export failed: {err.strip()[-500:]}")
    finally:
        container.remove(force=True)
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


def convert(client, image: str, out_dir: Path, *, digest: Optional[str] = None,
            options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, progress=None) -> SquashResult:
    """The image (any local reference) as OUT_DIR/<repo>+<digest>.sqsh; reused when it exists."""
    t0 = time.monotonic()
    try:
        img = client.images.get(image)
    except Exception as e:
        raise DeployError(f"image {image!r} is not in the local engine ({e}); run `invoke build` (or pull it) first") from None
    out = Path(out_dir) / sqsh_name(image, digest or img.id)
    if out.exists():
        return SquashResult(out, True, time.monotonic() - t0)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        if progress:
            progress(f"exporting {image} ({img.attrs.get('Size', 0) / 2**30:.2f} GiB)")
        export_rootfs(client, img.id, rootfs, progress)
        configure(rootfs, img.attrs.get("Config") or {})
        t1 = time.monotonic()
        if progress:
            progress(f"mksquashfs {' '.join(options)} -> {out.name}")
        partial = work / "image.sqsh"
        mksquashfs(rootfs, partial, options)
        t2 = time.monotonic()
        os.replace(partial, out)  # same filesystem: the .sqsh appears whole or not at all
        return SquashResult(out, False, time.monotonic() - t0, t1 - t0, t2 - t1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

"""An enroot squashfs (.sqsh) from a local image, without enroot.

Made the way `enroot import dockerd://IMAGE` (4.1.x) makes it, step by step, so the file is the same:
  1. `docker export` of a created container, extracted with `tar -px` minus `dev/*` and `.dockerenv`
     into a fresh directory (mode 0755);
  2. the permission fix-up: every entry gets u+r, directories and executables u+x, directories
     (down to depth 15) u+w, so an unprivileged user can read and later remove the tree;
  3. the four configuration files (mode 0644 unless the image already had the file):
       /etc/environment  the image's Env, one NAME=value per line;
       /etc/rc           labels as comments, `cd` to WorkingDir, source /etc/rc.local, then exec
                         Entrypoint + (the arguments given to `enroot start`, or Cmd);
       /etc/fstab        one bind line per image Volume;
       /etc/rc.local     an empty hook;
  4. `mksquashfs DIR OUT -all-root -processors N -comp lzo -noD -exit-on-error` (enroot's defaults:
     NFS-exportable, no forced fragments).
The facts this is held to were recorded from a real enroot import (tests/data/enroot_import_facts.json).
The output is named by the image digest and cached: a second conversion costs one stat().
"""
from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from deploy import diskspace
from deploy.job import DeployError

ENROOT_DEFAULT_OPTIONS = ("-comp", "lzo", "-noD", "-exit-on-error")
EXCLUDES = ("--exclude=dev/*", "--exclude=.dockerenv")
FIXPERMS_DIR_DEPTH = 15  # enroot gives u+w to directories down to this depth


@dataclass(frozen=True)
class SquashResult:
    path: Path
    cached: bool
    seconds: float
    export_seconds: float = 0.0
    squash_seconds: float = 0.0
    how: str = "full"      # "full", "incremental" (deploy/enroot_incremental.py) or "cached"
    note: str = ""         # why an incremental conversion fell back to a full one


def sqsh_name(repo: str, digest: str) -> str:
    """'host:5000/raytrain-cpu' + 'sha256:ab..' -> 'raytrain-cpu+sha256-ab...sqsh' (no '@' or ':' for Pyxis)."""
    base = repo.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    return f"{base}+{digest.replace(':', '-')}.sqsh"


def bash_q(word: str) -> str:
    """A word quoted as bash's ${word@Q} quotes it (what enroot writes into /etc/rc): '...' with ' as '\\'';
    $'...' with escapes when the word holds control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in word):
        escaped = "".join({"\n": "\\n", "\t": "\\t", "\r": "\\r", "'": "\\'", "\\": "\\\\"}.get(c)
                          or (f"\\{ord(c):03o}" if ord(c) < 32 or ord(c) == 127 else c) for c in word)
        return f"$'{escaped}'"
    return "'" + word.replace("'", "'\\''") + "'"


def _workdir_word(workdir: str) -> str:
    """enroot writes the working directory in double quotes, as is; a path a double-quoted shell word
    would change ($, `, \\, ") is single-quoted instead (enroot itself would expand it)."""
    return f'"{workdir}"' if not set(workdir) & set('$`\\"\n') else shlex.quote(workdir)


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

    def q(words: list[str]) -> str:
        return " ".join(bash_q(w) for w in words)
    lines += [f"mkdir -p {_workdir_word(workdir)} 2> /dev/null",
              f"cd {_workdir_word(workdir)} && unset OLDPWD || exit 1",
              "",
              "if [ -s /etc/rc.local ]; then",
              "    . /etc/rc.local",
              "fi",
              "",
              # enroot's template is `exec ${entrypoint@Q} "$@"` / `exec ${entrypoint@Q} ${cmd@Q}`: an
              # empty part still leaves its space (checked against a real enroot 4.1.2 import)
              "if [ $# -gt 0 ]; then",
              f"    exec {q(entry)} \"$@\"",
              "else",
              f"    exec {q(entry)} {q(cmd)}",
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


def _write_config_file(target: Path, text: str) -> None:
    """Truncate-and-write like a shell `>`: an existing file keeps its mode, a new one is 0644.

    A symlink is replaced, never followed (it could point out of the tree, into the host)."""
    if target.is_symlink():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def configure(rootfs: Path, config: dict, make_workdir: bool = True) -> None:
    """Write the configuration files into the extracted tree; create WorkingDir as enroot does (unless
    `make_workdir` is False: the incremental path knows it exists in the part already squashed)."""
    old = os.umask(0o022)  # new files 0644 and directories 0755, whatever the caller's umask
    try:
        (rootfs / "etc").mkdir(parents=True, exist_ok=True)
        for rel, text in config_files(config).items():
            _write_config_file(rootfs / rel, text)
        if make_workdir:
            workdir = (config.get("WorkingDir") or "/").lstrip("/")
            (rootfs / workdir).mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(old)


def fix_permissions(rootfs: Path) -> int:
    """enroot's fix-up, so an unprivileged user can read (and later delete) the tree: u+r on every
    entry, u+x on directories and on files executable by anyone, u+w on directories down to depth 15.
    Symlinks are left alone (their modes mean nothing). Returns the number of entries changed."""
    changed = 0
    root_depth = len(rootfs.parts)
    for dirpath, dirnames, filenames in os.walk(rootfs):
        depth = len(Path(dirpath).parts) - root_depth
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            want = mode | stat.S_IRUSR
            if stat.S_ISDIR(st.st_mode):
                want |= stat.S_IXUSR
                if depth + 1 <= FIXPERMS_DIR_DEPTH:
                    want |= stat.S_IWUSR
            elif mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
                want |= stat.S_IXUSR
            if want != mode:
                os.chmod(path, want)
                changed += 1
    return changed


@contextmanager
def exported(client, image_id: str, working_dir: Optional[str] = None) -> Iterator[Iterator[bytes]]:
    """`docker export` chunks of a created (never started) container of the image; removed afterwards.
    The engine creates the container's working directory in its tree (the image's WorkingDir unless
    `working_dir` says otherwise)."""
    kw = {"working_dir": working_dir} if working_dir else {}
    container = client.containers.create(image_id, command=["true"], entrypoint=[], **kw)
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


def export_rootfs(client, image_id: str, rootfs: Path, progress=None, working_dir: Optional[str] = None) -> int:
    """Stream the image's export into tar -x (minus dev/* and .dockerenv); returns bytes read."""
    total, tick = 0, _throttled(progress, 5, "export")
    with exported(client, image_id, working_dir) as chunks:
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


def make_rootfs(client, image_id: str, config: dict, rootfs: Path, progress=None) -> None:
    """Steps 1-3: the tree enroot would squash."""
    rootfs.mkdir()
    rootfs.chmod(0o755)
    export_rootfs(client, image_id, rootfs, progress)
    fix_permissions(rootfs)
    configure(rootfs, config)


def convert(client, image: str, out_dir: Path, *, digest: Optional[str] = None,
            options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, progress=None,
            layer_store: Optional[Path] = None, spare: bool = True) -> SquashResult:
    """The image (any local reference) as OUT_DIR/<repo>+<digest>.sqsh; reused when it exists.

    `client`: a Docker client, or a function that returns one, called only when the file must be made:
    with the digest given, a cached file is found without the engine (a login node without Docker).

    With `layer_store` (where the build keeps the layers it assembled), the layers below those are
    squashed once and cached, and the rest is appended (deploy/enroot_incremental.py); where that
    cannot be done honestly, a full conversion runs and `note` says why. `spare`: after an incremental
    conversion, copy the cached part for the next one in the background (enroot_incremental.prepare_spare)."""
    t0 = time.monotonic()
    if digest and (Path(out_dir) / sqsh_name(image, digest)).exists():  # a cached file needs no engine
        return SquashResult(Path(out_dir) / sqsh_name(image, digest), True, time.monotonic() - t0, how="cached")
    if callable(client):
        try:
            client = client()
        except Exception as e:
            raise DeployError(f"making {sqsh_name(image, digest) if digest else 'the .sqsh'} needs the Docker engine, "
                              f"and {e}. Run this deploy where the engine is reachable (the file is then cached "
                              f"in {out_dir}), or copy a made .sqsh there") from None
    try:
        img = client.images.get(image)
    except Exception as e:
        raise DeployError(f"image {image!r} is not in the local engine ({e}); run `invoke build` (or pull it) first") from None
    out = Path(out_dir) / sqsh_name(image, digest or img.id)
    if out.exists():
        return SquashResult(out, True, time.monotonic() - t0, how="cached")
    out.parent.mkdir(parents=True, exist_ok=True)
    note = ""
    if layer_store is not None:
        from deploy import enroot_incremental as inc
        try:
            cache_s, append_s = inc.convert(client, img, out, Path(layer_store), options, progress, spare)
            return SquashResult(out, False, time.monotonic() - t0, cache_s, append_s, how="incremental")
        except inc.Fallback as e:
            note = f"full conversion: {e}"
            if progress:
                progress(note)
    # the extracted image, then its squashfs beside it
    diskspace.require(out.parent, 2 * int(img.attrs.get("Size") or 0), f"converting {image} to {out.name}")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        partial = work / "image.sqsh"
        if progress:
            progress(f"converting {image} ({img.attrs.get('Size', 0) / 2**30:.2f} GiB, {' '.join(options)}) -> {out.name}")
        make_rootfs(client, img.id, img.attrs.get("Config") or {}, work / "rootfs", progress)
        t1 = time.monotonic()
        if progress:
            progress(f"extracted in {t1 - t0:.1f}s; mksquashfs")
        mksquashfs(work / "rootfs", partial, options)
        t2 = time.monotonic()
        os.replace(partial, out)  # same filesystem: the .sqsh appears whole or not at all
        return SquashResult(out, False, time.monotonic() - t0, t1 - t0, t2 - t1, note=note)
    finally:
        shutil.rmtree(work, ignore_errors=True)

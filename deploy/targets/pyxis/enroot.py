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
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from deploy.job import DeployError
from runtime.errors import InputError
from runtime.imageref import ImageRef

ENROOT_DEFAULT_OPTIONS = ("-comp", "lzo", "-noD", "-exit-on-error")
EXCLUDES = ("--exclude=dev/*", "--exclude=.dockerenv")
FIXPERMS_DIR_DEPTH = 15  # enroot gives u+w to directories down to this depth


def sqsh_name(image: str, digest: str) -> str:
    """'host:5000/raytrain-cpu:tag' + 'sha256:ab..' -> 'raytrain-cpu+sha256-ab...sqsh' (runtime/imageref.py)."""
    try:
        return ImageRef.parse(image, "image").at(digest).sqsh_name()
    except InputError as e:
        raise DeployError(str(e)) from None


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
        container.remove(force=True, v=True)  # with the anonymous volumes an image's VOLUME made


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

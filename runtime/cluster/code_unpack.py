"""The code a held cluster's run brings on stdin: a tar, read as data, unpacked whole or not at all.

`invoke run` sends the project's files as the app layer holds them (toolchain.image.layers: regular files
and directories only, uncompressed, under one relative directory). Anything else is refused before a
byte is written: links of either kind (a chain of symlinks, each harmless alone, wrote outside the
root together), devices, FIFOs, sparse members, names that are absolute, climb with `..`, are empty
or lie outside the run's directory, one name given twice or as both a file and a directory, more
than MAX_MEMBERS members, MAX_DEPTH directories deep or MAX_BYTES of contents, and a stream that ends early (a tar cut at a
member boundary reads as a shorter valid tar: the end-of-archive blocks must be there).

Every file is written by this module (O_EXCL|O_NOFOLLOW, in directories it made itself, modes
0644/0755 and the unpacking user as owner, whatever the tar says) into a fresh directory beside the
target, renamed into place only when complete; on any failure that directory is removed, and so are
the parents this call created. The images' Python (Debian's 3.11.2) has no tarfile extraction
filters, so none are relied on.
"""
from __future__ import annotations

import io
import os
import select
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from runtime.errors import InputError, os_message

MAX_BYTES = 1 << 30      # the most a run's code may be (the app layer is code, not data)
MAX_MEMBERS = 50_000     # files and directories
MAX_DEPTH = 64           # directories in a member's name: each file's checks and writes walk them
STALL_S = 60.0           # the sender gave no byte for this long: it stalled
BLOCK = tarfile.BLOCKSIZE


def _name(member: tarfile.TarInfo, prefix: PurePosixPath) -> PurePosixPath:
    raw = member.name
    path = PurePosixPath(raw)
    if not raw or raw.startswith("/") or any(part in ("", ".", "..") for part in raw.rstrip("/").split("/")):
        raise InputError(f"the code tar's member {raw[:200]!r} is absolute, empty or climbs with '..'; "
                         "send the code with `invoke run`")
    if "\0" in raw:
        raise InputError(f"the code tar's member {raw[:200]!r} has a NUL byte in its name")
    if raw.rstrip("/").count("/") > MAX_DEPTH:
        raise InputError(f"the code tar's member {raw[:120]!r}... is {raw.rstrip('/').count('/')} directories deep; "
                         f"the code's tree is at most {MAX_DEPTH} deep")
    if path != prefix and prefix not in path.parents and path not in prefix.parents:
        raise InputError(f"the code tar's member {raw[:200]!r} lies outside {prefix}/")
    return path


def _kind(member: tarfile.TarInfo) -> str:
    if member.isdir():
        return "dir"
    if member.isreg() and not member.issparse():
        return "file"
    what = ("a symlink" if member.issym() else "a hard link" if member.islnk() else
            "a sparse file" if member.issparse() else "a device, FIFO or other special file")
    raise InputError(f"the code tar's member {member.name[:200]!r} is {what}; the code is regular files and "
                     "directories only (the app layer holds no links)")


def read_members(data: bytes, prefix: PurePosixPath) -> list[tuple[tarfile.TarInfo, PurePosixPath, str]]:
    """Every member, checked, in order; InputError before anything is written."""
    out = []
    total = 0
    seen: dict[PurePosixPath, str] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            while True:
                member = tf.next()
                if member is None:
                    break
                if len(out) >= MAX_MEMBERS:
                    raise InputError(f"the code tar has over {MAX_MEMBERS} members; keep data out of project.app_dir")
                path, kind = _name(member, prefix), _kind(member)
                total += member.size
                if total > MAX_BYTES:
                    raise InputError(f"the code tar's contents are over {MAX_BYTES >> 20} MiB; keep data out of "
                                     "project.app_dir")
                if member.offset_data + member.size > len(data):
                    raise InputError(f"the code tar ends inside {member.name[:200]!r}: the stream was cut short")
                before = seen.get(path)
                if before is not None and not (before == kind == "dir"):
                    raise InputError(f"the code tar names {member.name[:200]!r} twice ({before}, then {kind})")
                for parent in list(path.parents)[:-1]:  # not '.'
                    if seen.setdefault(parent, "dir") == "file":
                        raise InputError(f"the code tar has {str(parent)!r} as a file and as a directory")
                seen[path] = kind
                out.append((member, path, kind))
            end = tf.offset
    except tarfile.TarError as e:
        raise InputError(f"the code on stdin is not a tar archive ({e})") from None
    if data[end:end + 2 * BLOCK] != bytes(2 * BLOCK):
        raise InputError("the code tar has no end-of-archive blocks: the stream was cut short")
    return out


def _read_block(stream, n: int, stall_s: float) -> bytes:
    """Up to N bytes (fewer only at the stream's end); InputError when the sender gives none for STALL_S."""
    out = bytearray()
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = None
    while len(out) < n:
        if fd is None:
            chunk = stream.read(n - len(out))
        else:
            ready, _, _ = select.select([fd], [], [], stall_s)
            if not ready:
                raise InputError(f"the code on stdin stalled: no byte came for {stall_s:.0f} s (the sender stopped "
                                 "sending without closing the stream)")
            chunk = os.read(fd, n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_tar(stream, stall_s: float = STALL_S) -> bytes:
    """The tar on STREAM, read up to its end-of-archive blocks and no further (a sender that keeps the
    stream open after a whole tar is not waited for), bounded by MAX_BYTES; a stream that ends before
    them is returned as it is (read_members then says it was cut short)."""
    data = bytearray()
    limit = MAX_BYTES + 64 * BLOCK
    while True:
        header = _read_block(stream, BLOCK, stall_s)
        data += header
        if len(header) < BLOCK:
            return bytes(data)
        if header == bytes(BLOCK):  # a zero block: the end when the next one is zero too
            second = _read_block(stream, BLOCK, stall_s)
            data += second
            if len(second) < BLOCK or second == bytes(BLOCK):
                return bytes(data)
            header = second
        try:
            size = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape").size
        except tarfile.TarError:
            return bytes(data)  # not a tar header: read_members says what is wrong
        need = -(-size // BLOCK) * BLOCK
        if len(data) + need > limit:
            raise InputError(f"the code on stdin is over {MAX_BYTES >> 20} MiB; keep data out of project.app_dir")
        body = _read_block(stream, need, stall_s)
        data += body
        if len(body) < need:
            return bytes(data)


def _made_parents(path: Path) -> list[Path]:
    """The missing directories above PATH, outermost first."""
    missing = []
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing.append(parent)
    return list(reversed(missing))


def unpack(root: Path, code_dir: Path, stream) -> None:
    """The code on STREAM into CODE_DIR (below ROOT, named by the code's hash: a version already there is
    the same bytes, and the stream is not read as a tar then)."""
    root = Path(os.path.abspath(root))
    if root.exists() and not root.is_dir():
        raise InputError(f"--unpack-stdin {root}: not a directory; give the directory the code is unpacked under")
    code_dir = Path(os.path.abspath(code_dir))
    if code_dir == root or root not in code_dir.parents:
        raise InputError(f"--code-dir {code_dir}: must lie below --unpack-stdin {root}")
    data = read_tar(stream)  # read whole even when this version is there: the sender writes it all first
    if code_dir.is_symlink() or (code_dir.exists() and not code_dir.is_dir()):
        raise InputError(f"--code-dir {code_dir}: something other than a directory is there; remove it")
    if code_dir.is_dir():
        return
    rel = PurePosixPath(code_dir.relative_to(root).as_posix())
    members = read_members(data, rel)
    if not any(path == rel or rel in path.parents for _, path, _ in members):
        raise InputError(f"the code tar holds nothing under {rel}")
    created = _made_parents(code_dir)
    scratch = None
    done = False
    try:
        code_dir.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=code_dir.parent))
        _write(data, members, scratch)
        try:
            (scratch / rel).rename(code_dir)
        except OSError:
            if not code_dir.is_dir():  # another run of the same code may have put it there first: the same bytes
                raise
        done = True
    except OSError as e:
        raise InputError(f"the code could not be unpacked: {os_message(e)}") from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if not done:  # nothing of a failed unpack stays, the directories it made included
            for parent in reversed(created):
                try:
                    parent.rmdir()
                except OSError:
                    break


def _write(data: bytes, members, scratch: Path) -> None:
    fd_root = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for member, path, kind in members:
            parent = fd_root
            opened = []
            try:
                for part in path.parts[:-1]:  # every directory on the way is ours (made here, never a link)
                    try:
                        os.mkdir(part, 0o755, dir_fd=parent)
                    except FileExistsError:
                        pass
                    parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
                    opened.append(parent)
                leaf = path.parts[-1]
                if kind == "dir":
                    try:
                        os.mkdir(leaf, 0o755, dir_fd=parent)
                    except FileExistsError:
                        pass  # made on the way to an earlier member
                    continue
                mode = 0o755 if member.mode & 0o111 else 0o644
                fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(data[member.offset_data:member.offset_data + member.size])
            finally:
                for fd in reversed(opened):
                    os.close(fd)
    finally:
        os.close(fd_root)

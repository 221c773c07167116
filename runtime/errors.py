"""The one error base of the project, with the exit code the CLI ends with.

Every user-facing error (bad spec, bad flag, a pre-flight problem, a failed build or push) is a
RaytrainError: its message names the input, what was wrong and what to do. Anything else reaching
the CLI is a bug. The runtime package holds it because the in-image runtime raises them too, and
everything else depends on the runtime, never the other way.
"""
from __future__ import annotations

import errno
from typing import Optional


class RaytrainError(Exception):
    """A failure the user can act on (exit code 1): a build, push or run that did not work."""

    exit_code = 1


class InputError(RaytrainError, ValueError):
    """Bad input (a flag, a spec, a recorded file, a scheduler variable): nothing was changed (exit 2)."""

    exit_code = 2


# what to do about the errno a file operation ended with
_OS_FIXES = {
    errno.EACCES: "check its permissions (or give a path you can write)",
    errno.EPERM: "check its permissions (or give a path you can write)",
    errno.EROFS: "the filesystem is read-only; give a path on a writable one",
    errno.ENOSPC: "the disk is full; free space or give a path on another disk",
    errno.EDQUOT: "the disk quota is used up; free space or give a path on another disk",
    errno.ENAMETOOLONG: "a name in the path is too long (at most 255 bytes per name); shorten it",
    errno.ENOTDIR: "a part of the path is a file, not a directory; give a directory path",
    errno.EISDIR: "that is a directory; give a file path, or remove the directory",
    errno.ENOENT: "a directory on the path does not exist; create it or correct the path",
    errno.EEXIST: "something is already there; remove it or give another path",
}


def os_message(e: OSError, where: Optional[str] = None) -> str:
    """One line for a failed file operation: where, the system's words and errno name, what to do."""
    if where is None:
        where = e.filename if e.filename is not None else "(no path)"
        if e.filename2 is not None:
            where = f"{where} -> {e.filename2}"
    name = errno.errorcode.get(e.errno or 0, "")
    fix = _OS_FIXES.get(e.errno or 0, "check the path")
    return f"{where}: {e.strerror or e}{f' ({name})' if name else ''}; {fix}"

"""Reading a file the user, a cache or another tool left: the one bounded read every such file goes through.

`read_regular` opens without waiting (O_NONBLOCK: a FIFO does not block the open), then checks what it
opened (fstat: a regular file, at most MAX bytes) and reads at most MAX + 1 bytes, so a FIFO, a device
(/dev/zero behind a link), a directory or a file that grows while read is refused, never waited on or read
without end. FOLLOW=False also refuses a link (a cache's entries: what this toolchain wrote is never one).
Every refusal is a FileReadError whose message says what the path is; the caller names the file and what to do.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Union


class FileReadError(OSError):
    """The path could not be read as a bounded regular file; str() says why, in words for the user."""


def read_regular(path: Union[str, Path], max_bytes: int, follow: bool = True) -> bytes:
    """The bytes of the regular file PATH, at most MAX_BYTES; FileNotFoundError when there is none."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "a link" if not follow and e.errno == 40 else (e.strerror or type(e).__name__)
        raise FileReadError(f"cannot be opened as a file ({why})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileReadError("is not a regular file (a directory, FIFO, device or socket)")
        if st.st_size > max_bytes:
            raise FileReadError(f"is {st.st_size} bytes, more than the {max_bytes} it may be")
        chunks, size = [], 0
        while size <= max_bytes:
            block = os.read(fd, max_bytes + 1 - size)
            if not block:
                break
            chunks.append(block)
            size += len(block)
        if size > max_bytes:
            raise FileReadError(f"grew past {max_bytes} bytes while it was read")
        return b"".join(chunks)
    except FileReadError:
        raise
    except OSError as e:
        raise FileReadError(f"cannot be read ({e.strerror or type(e).__name__})") from None
    finally:
        os.close(fd)

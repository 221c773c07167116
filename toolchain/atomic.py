"""Files of the build directory and the user's cache written whole or not at all, never through a link.

The data goes to a fresh temporary file beside the target (mkstemp: O_CREAT|O_EXCL with a random name,
so a link someone planted under a predictable name such as `runs.json.tmp` is never written through),
then is renamed over the target (a rename replaces a link at the target itself; it does not follow it).
A crash leaves the old file and at most a `.partial` beside it."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

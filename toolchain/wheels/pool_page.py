"""The wheel pool as uv's find-links: a flat index page naming each wheel with its sha256.

Given the pool's directory, uv reads every wheel in it to hash it for the lock, at every resolution (the
example's set: 3.9 GiB). Given a page whose links carry `#sha256=`, uv takes the hashes from the page and
reads no wheel; the lock is the same (docs/benchmarks.md, "a resolution on a warm machine").

The hashes come from HASHES in the pool: each wheel's sha256 with the stat it had when it was hashed (size,
inode, mtime and ctime: a file written again or replaced has another), recorded by whoever checked the bytes
(the download against the lock, the wheelhouse as it reads a set) or, for a wheel found with no matching
record, hashed here once. A pool that cannot be written has its wheels hashed at each resolution.
"""
from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path
from typing import Optional

from toolchain.atomic import write_atomic
from toolchain.publish.blobs import file_sha256

HASHES = ".sha256.json"
_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_RECORD = 16 << 20


def fingerprint(path: Path) -> tuple[int, int, int, int]:
    """A file's (size, inode, mtime ns, ctime ns): another after any rewrite, even of equal size and mtime (its
    ctime moves, which no user can set). OSError where there is no such file."""
    st = os.stat(path, follow_symlinks=False)
    return st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _stat(path: Path) -> Optional[list[int]]:
    try:
        return list(fingerprint(path))
    except OSError:
        return None


def _read(pool: Path) -> dict[str, list]:
    """The record, read as untrusted: entries that are not [sha256 hex, 4 whole numbers] are no entries."""
    try:
        with open(pool / HASHES, "rb") as f:
            data = json.loads(f.read(_MAX_RECORD + 1)[:_MAX_RECORD] or b"{}")
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 5
            and isinstance(v[0], str) and _HEX.fullmatch(v[0]) and all(type(n) is int for n in v[1:])}


def _write(pool: Path, record: dict[str, list]) -> None:
    """RECORD, less the wheels no longer in the pool, as HASHES."""
    kept = {k: v for k, v in record.items() if (pool / k).exists()}
    try:
        write_atomic(pool / HASHES, json.dumps(kept, sort_keys=True))
    except OSError:  # a read-only or full pool: the next resolution hashes again
        pass


def record(pool: Path, checked: dict[str, str]) -> None:
    """Record CHECKED (wheel file name -> the sha256 its bytes were just checked against) as the files are now."""
    if not checked:
        return
    known = _read(pool)
    for name, digest in checked.items():
        st = _stat(pool / name)
        if st is not None and _HEX.fullmatch(digest):
            known[name] = [digest, *st]
    _write(pool, known)


def recorded(pool: Path, names: list[str]) -> dict[str, str]:
    """The sha256 recorded for each of NAMES whose file is as it was when its bytes were checked."""
    known = _read(pool)
    return {n: known[n][0] for n in names if n in known and known[n][1:] == _stat(pool / n)}


def page(pool: Path, dest: Path) -> Path:
    """DEST written as the flat index page of the pool's wheels, each link with its sha256 (those with no
    record of their present stat are hashed now, and recorded)."""
    known = _read(pool)
    lines, changed = ["<!DOCTYPE html>", "<html><body>"], False
    for wheel in sorted(pool.glob("*.whl")):
        st = _stat(wheel)
        if st is None or wheel.is_symlink():  # as `resolver.in_pool`: the pool's own files only
            continue
        entry = known.get(wheel.name)
        if entry is None or entry[1:] != st:
            entry = known[wheel.name] = [file_sha256(wheel).hex, *st]
            changed = True
        lines.append(f'<a href="{html.escape(wheel.absolute().as_uri())}#sha256={entry[0]}">{html.escape(wheel.name)}</a><br>')
    lines.append("</body></html>")
    if changed:
        _write(pool, known)
    dest.write_text("\n".join(lines) + "\n")
    return dest

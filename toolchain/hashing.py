"""Content keys: equal inputs give equal keys, so equal inputs give equal image tags."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

IGNORED_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", "build", ".venv"}
IGNORED_SUFFIXES = (".pyc", ".pyo")


def key_of(*parts: object) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def iter_tree(root: Path) -> Iterable[Path]:
    """Files under root that belong in an image, in a stable order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            if not name.endswith(IGNORED_SUFFIXES):
                yield Path(dirpath) / name


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for f in iter_tree(root):
        rel = f.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(str(os.stat(f).st_mode & 0o111).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()

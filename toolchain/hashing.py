"""Content keys: equal inputs give equal keys, so equal inputs give equal image tags.

A source tree's files (the code and the runtime package: their layer, their hashes, the code a held
cluster is sent) are, in a git work tree, those git lists (tracked, and untracked ones .gitignore does
not exclude: a repository's data, outputs and checkpoints stay out of the image), and elsewhere every
file; in both cases without IGNORED_DIRS and compiled bytecode, in the same order."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterable, Optional

IGNORED_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", "build", ".venv"}
IGNORED_SUFFIXES = (".pyc", ".pyo")


def key_of(*parts: object) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _git_listed(root: Path) -> Optional[set[str]]:
    """The files git lists under ROOT (relative paths); None when ROOT is not in a git work tree, or git
    lists nothing there (a directory git ignores whole, such as a venv's site-packages/runtime inside a
    user's repository, is every file it holds)."""
    try:
        res = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", "."], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return {p for p in res.stdout.decode("utf-8", "surrogateescape").split("\0") if p} or None


def iter_tree(root: Path) -> Iterable[Path]:
    """Files under root that belong in an image, in a stable order (a directory's files, then its
    subdirectories', each sorted by name)."""
    listed = _git_listed(root)
    within = None  # the directories that hold a listed file
    if listed is not None:
        within = {"."}
        for p in listed:
            d = os.path.dirname(p)
            while d:
                within.add(d)
                d = os.path.dirname(d)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS
                             and (within is None or os.path.normpath(os.path.join(rel_dir, d)) in within))
        for name in sorted(filenames):
            if name.endswith(IGNORED_SUFFIXES):
                continue
            if listed is not None and os.path.normpath(os.path.join(rel_dir, name)) not in listed:
                continue
            yield Path(dirpath) / name


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for f in iter_tree(root):
        rel = f.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(str(os.stat(f).st_mode & 0o111).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()

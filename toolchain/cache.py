"""The user's cache: one directory per user, shared by every project they build, like pip's.

    $RAYTRAIN_CACHE, else $XDG_CACHE_HOME/raytrain, else ~/.cache/raytrain
      layer-index/    the dependency layer a layer key gave (toolchain/venv_plan.py)
      blobs/          compressed layers of builds that keep no blob cache of their own (toolchain/push.py)
      blob-digests/   each layer's compressed digest, per diff ID (toolchain/blobs.py)
      blob-homes/     where each blob was pushed, for cross-repository mounts (toolchain/blobs.py)

Everything in it is content-addressed: two projects that need the same layer find it here,
and a build whose cache is empty makes it again.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "RAYTRAIN_CACHE"
LAYER_INDEX = "layer-index"
BLOBS = "blobs"
BLOB_DIGESTS = "blob-digests"
BLOB_HOMES = "blob-homes"
PARTS = (LAYER_INDEX, BLOBS, BLOB_DIGESTS, BLOB_HOMES)


def root() -> Path:
    """Where the cache is; nothing is created here."""
    given = os.environ.get(ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "raytrain"


def part(name: str) -> Path:
    """One of the cache's directories (PARTS), not created."""
    if name not in PARTS:
        raise ValueError(f"not a part of the cache: {name!r}")
    return root() / name

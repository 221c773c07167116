"""The user's cache: one directory per user, shared by every project they build, like pip's.

    $RAYTRAIN_CACHE, else $XDG_CACHE_HOME/raytrain, else ~/.cache/raytrain
      wheels/         the wheel pool: every wheel once, whichever project's set uses it (toolchain/wheels/wheelhouse.py)
      wheel-sets/     each requirement set's resolution: its wheels' names and hashes, its lock
      layer-index/    the dependency layer a layer key gave (toolchain/image/venv_plan.py)
      blobs/          compressed layers of builds that keep no blob cache of their own (toolchain/publish/push.py)
      blob-digests/   each layer's compressed digest, per diff ID (toolchain/publish/blobs.py)
      blob-homes/     where each blob was pushed, for cross-repository mounts (toolchain/publish/blobs.py)
      uv/             uv's own cache: the metadata a requirement set's resolution reads (toolchain/wheels/resolver.py)

Everything in it is content-addressed: two projects that need the same wheel or layer find it here,
and a build whose cache is empty makes it again. `raytrain clean --cache` removes it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from runtime.files import FileReadError, read_regular
from toolchain.errors import ConfigError

ENV = "RAYTRAIN_CACHE"
WHEELS = "wheels"
WHEEL_SETS = "wheel-sets"
LAYER_INDEX = "layer-index"
BLOBS = "blobs"
BLOB_DIGESTS = "blob-digests"
BLOB_HOMES = "blob-homes"
UV = "uv"
PARTS = (WHEELS, WHEEL_SETS, LAYER_INDEX, BLOBS, BLOB_DIGESTS, BLOB_HOMES, UV)


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


def writable(name: str) -> Path:
    """The cache directory NAME, made if missing; a ConfigError naming it when it cannot be written."""
    d = part(name)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"the cache directory {d} is not writable ({e.strerror or e}); make it writable, or point "
                          f"{ENV} at a directory you own (e.g. {ENV}=$HOME/.cache/raytrain)") from None
    return d


def size_of(directory: Path) -> int:
    """Bytes under DIRECTORY (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(directory):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def clear() -> tuple[Path, int]:
    """Remove every part of the cache: (the cache's root, the bytes freed). Files others left in the
    root are kept."""
    freed = 0
    for name in PARTS:
        d = part(name)
        if d.is_dir() and not d.is_symlink():
            freed += size_of(d)
            shutil.rmtree(d)
        elif d.is_symlink():
            d.unlink()
    return root(), freed


class BadEntry(Exception):
    """A cache file that cannot be what this toolchain wrote (the message says why): it is dropped and made again."""


def read_entry(path: Path, max_bytes: int = 1 << 20) -> Optional[bytes]:
    """The bytes of the cache file PATH, or None when there is none. A link, a FIFO or anything but a regular
    file, or one over MAX_BYTES, is a BadEntry: everything in the cache is read as untrusted, and opening it
    never follows a link or waits on a pipe."""
    try:
        return read_regular(path, max_bytes, follow=False)
    except FileNotFoundError:
        return None
    except FileReadError as e:
        raise BadEntry(str(e)) from None


"""The dependency layers' plan: which wheels share a layer, in which order, and each layer's key.

The rule (docs/image-layers.md):
  - a wheel of OWN_LAYER_BYTES or more unpacked has a layer of its own;
  - a smaller one goes to one of GROUPS group layers, chosen by a hash of its distribution's name.
    The rule looks at the wheel alone, never at the rest of the set; adding a small wheel changes its
    group's layer and nothing else. Sixteen groups, so a group holds a couple of wheels: a fresh runner
    that adds one downloads only its group's few others to write the layer (the example's 32 small
    wheels fall in 14 groups, half a MiB of wheels at the median);
  - order, bottom first: the own layers of wheels with less than MODULE_BYTES of Python source (the
    CUDA libraries), then the others (torch, triton, ray, numpy...), each biggest first (ties by
    name); then the groups by number. Big wheels change least, so a change high in the stack leaves most of it alone:
    the Docker engine re-applies every layer above the first changed one (its layer store chains
    them), containerd and enroot only fetch what they lack. The libraries first also let the
    engine start loading while the modules of the others are still being compiled.
  - at most MAX_OWN own layers: in a set with more big wheels than that, the smallest of them go to
    their groups too (the only case where the set decides, and said by the build). With the GROUPS,
    the venv's top layer and the image's seven others, an image stays below the overlay limit (128):
    at most 120 layers.

A layer's key is made of what its bytes depend on, and nothing else: each wheel's file name and
sha256, the venv's path and Python minor version (site-packages), and the host compiler's identity
when the host writes its bytecode (toolchain/image/bytecode.py `identity`). So the same wheel gives the
same layer, diff ID and blob digest in every project, checkout and machine with that host Python.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from toolchain import cache
from toolchain.hashing import key_of
from runtime.digest import Digest, DigestError
from toolchain.image.venv_layer import dist_name, is_script_name

FORMAT = 1                 # bump when a layer's bytes change for the same key (toolchain/image/venv_layer.py)
OWN_LAYER_BYTES = 4 << 20  # unpacked: this big and up, a layer of its own
GROUPS = 16                # the group layers of the smaller wheels
MAX_OWN = 96
MODULE_BYTES = 1 << 20     # of .py source: a wheel with this much or more goes above the libraries


@dataclass(frozen=True)
class PlannedLayer:
    name: str                 # the wheel's distribution, or "group-N"
    wheels: tuple[Path, ...]  # in name order
    key: str
    size: int                 # unpacked bytes (the progress total)


def group_of(wheel: Path) -> int:
    """The group layer a small wheel goes to: its distribution's name alone decides."""
    return int.from_bytes(hashlib.sha256(dist_name(wheel).encode()).digest()[:4], "big") % GROUPS


def measure(wheel: Path) -> tuple[int, bool]:
    """(unpacked bytes, whether it ships MODULE_BYTES or more of Python source)."""
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
    return (sum(i.file_size for i in infos),
            sum(i.file_size for i in infos if i.filename.endswith(".py")) >= MODULE_BYTES)


def plan(wheels: list[Path], sha256: dict[str, str], venv: str, minor: str, compiler: Optional[list],
         measured: Optional[dict[str, tuple[int, bool]]] = None) -> tuple[list[PlannedLayer], list[str]]:
    """(the layers bottom first, the big wheels sent to a group because of MAX_OWN). SHA256: each wheel's
    file name -> its sha256 hex (the wheelhouse's manifest). MEASURED: `measure` of some wheels by file
    name, known without their files (a previous image's provenance); the others are measured here."""
    measured = {w: (measured or {}).get(w.name) or measure(w) for w in wheels}
    sizes = {w: m[0] for w, m in measured.items()}
    big = sorted((w for w in wheels if sizes[w] >= OWN_LAYER_BYTES), key=lambda w: (-sizes[w], w.name))
    overflow = big[MAX_OWN:]
    big = sorted(big[:MAX_OWN], key=lambda w: (measured[w][1], -sizes[w], w.name))
    groups: dict[int, list[Path]] = {}
    for w in wheels:
        if sizes[w] < OWN_LAYER_BYTES or w in overflow:
            groups.setdefault(group_of(w), []).append(w)

    def layer(name: str, members: list[Path]) -> PlannedLayer:
        members = sorted(members, key=lambda w: w.name)
        key = key_of("wheel-layer", FORMAT, [(w.name, sha256[w.name]) for w in members], venv, minor, compiler)
        return PlannedLayer(name, tuple(members), key, sum(sizes[w] for w in members))
    out = [layer(dist_name(w), [w]) for w in big]
    out += [layer(f"group-{g}", groups[g]) for g in sorted(groups)]
    return out, [w.name for w in overflow]


def default_index() -> Path:
    """The user cache's layer index (toolchain/cache.py): <layer key>.json, shared by every build directory."""
    return cache.part(cache.LAYER_INDEX)


class LayerIndex:
    """DIR/<layer key>.json: the layer a key gave ({diff_id, size, scripts}), so a build that needs it again
    (this project's next one, or another project's with the same wheel) knows its diff ID, and whether the
    engine or the registry has it, without writing it. The key names the layer's bytes, so the index is
    shared by every build directory; the tar itself is <build_dir>/layers/<diff id hex>.tar while it is
    kept (the push drops it once its blob is made)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def get(self, key: str, on_bad: Optional[Callable[[str], None]] = None) -> Optional[dict]:
        """The entry of KEY, checked as untrusted (toolchain/cache.py read_entry): a diff ID that is a digest,
        a size, console-script names a wheel may install. None when there is none, or when it fails a check
        (ON_BAD is told why; the layer is then written again and the entry replaced)."""
        path = self.dir / f"{key}.json"
        try:
            data = cache.read_entry(path, MAX_ENTRY)
            if data is None:
                return None
            return _checked_entry(json.loads(data))
        except (cache.BadEntry, ValueError, RecursionError) as e:
            if on_bad is not None:
                on_bad(f"the layer index entry {path} {e if isinstance(e, cache.BadEntry) else 'is damaged: ' + str(e)[:160]}; "
                       "the layer is written again")
            return None

    def put(self, key: str, diff_id: str, size: int, scripts: list[tuple[str, bytes]]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        doc = {"diff_id": diff_id, "size": size, "scripts": [[n, d.decode("utf-8", "surrogateescape")] for n, d in scripts]}
        tmp = self.dir / f".{key}.{os.getpid()}.partial"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.dir / f"{key}.json")


MAX_ENTRY = 4 << 20   # an entry's file: a diff ID, a size and the console scripts' texts
MAX_SIZE = 1 << 42    # a layer's bytes (torch's is 1.7 GiB)
MAX_SCRIPTS = 10_000


def _checked_entry(entry: object) -> dict:
    """ENTRY as LayerIndex.put writes it, or ValueError naming what is not."""
    if not isinstance(entry, dict) or set(entry) != {"diff_id", "size", "scripts"}:
        raise ValueError("not an object of diff_id, size and scripts")
    try:
        entry["diff_id"] = Digest(entry["diff_id"], "diff_id")
    except DigestError as e:
        raise ValueError(str(e)) from None
    size = entry["size"]
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_SIZE:
        raise ValueError(f"size {str(size)[:40]!r} is not a layer's size")
    scripts = entry["scripts"]
    if not isinstance(scripts, list) or len(scripts) > MAX_SCRIPTS:
        raise ValueError(f"scripts is not a list of at most {MAX_SCRIPTS}")
    for item in scripts:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise ValueError("a script is not [name, text]")
        if not is_script_name(item[0]):
            raise ValueError(f"the console script name {item[0][:80]!r} is not one a wheel may install")
    return entry


def scripts_of(entry: dict) -> list[tuple[str, bytes]]:
    return [(n, d.encode("utf-8", "surrogateescape")) for n, d in entry["scripts"]]

"""The .sqsh of a new app/spec layer in seconds: squash the lower layers once, append the rest.

A full conversion (deploy/targets/pyxis/enroot.py) squashes the whole exported image: 7 GB, over a minute. When
only thin layers on top changed, most of that work is the same every time. `mksquashfs` can
append to an existing image, but only at its root: a top-level name that already exists is added
again under another name (`etc_1`), never merged. So the split is by top-level directory:

  cache (once per lower layer chain, in <out_dir>/.lower/<key>/):
    the lower image exported and fixed up exactly as a full conversion does, then
      hot/       its top-level entries that the upper layers touch, plus /etc (enroot's config files
                 live there) and the WorkingDir's top directory when the lower image lacks it;
      base.sqsh  everything else, squashed with enroot's options;
  per image:
    a copy of base.sqsh; stage = hot/ + the upper layers extracted in order; enroot's fix-up and
    config files on the stage; `mksquashfs stage copy` appends the stage's top-level entries.
    The copy is made ahead, in the background after each conversion (spare.sqsh), so the next code
    change only renames it: on ext4 copying 6.6 GB is most of what is left.

The image layout keeps this cheap: the app lives in /app, away from /opt/venv (runtime/contract.py),
so the stage holds /app and /etc (a few MB), not the venv. The upper layers' files come from the
layer store the build writes (<build_dir>/layers/<diff id>.tar; toolchain/image/layers.py): a layer is
upper when its tar is there and hashes to its diff ID.

Falls back to a full conversion, with the reason, when: no top layer is in the store, a layer
deletes lower files (a whiteout), no local image has the lower chain and no cache exists, or
anything unexpected happens while staging (tar refuses an entry, a stray top-level name). The
result holds the same entries, modes, owners, link targets and files as a full conversion
(tests/test_enroot_incremental.py); only inode order and the append time differ.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Optional, Sequence

from deploy.layer_store import LayerStore
from deploy.targets.pyxis import diskspace, enroot
from runtime.contract import BIG_LAYER_BYTES, VENV
from runtime.digest import Digest
from deploy.job import DeployError

FORMAT = 2            # bump when what the cache holds changes
KEEP_CACHES = 2       # lower caches kept per output directory (most recently used)
ALWAYS_HOT = ("etc",)  # enroot writes /etc/{environment,fstab,rc,rc.local}


class Fallback(Exception):
    """Why this image gets a full conversion instead (said to the user, then a full conversion runs)."""


@dataclass(frozen=True)
class Split:
    lower_chain: list[str]   # diff IDs below the upper layers
    upper: list[Path]        # the upper layers' tars, bottom first
    tops: set[str]           # top-level names the upper layers touch


def _sha256_file(path: Path) -> Digest:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return Digest.of_hash(h)


def _tops_of(layer: Path) -> set[str]:
    """Top-level names a layer tar touches; a whiteout or an escaping name is a Fallback."""
    tops = set()
    with tarfile.open(layer) as tf:
        for m in tf:
            p = PurePosixPath(m.name)
            if p.is_absolute() or ".." in p.parts:
                raise Fallback(f"layer {layer.name} has an entry outside the root ({m.name!r})")
            if p.name.startswith(".wh."):
                raise Fallback(f"layer {layer.name} deletes lower files (whiteout {m.name!r})")
            if p.parts and p.parts[0] != ".":
                tops.add(p.parts[0])
            elif len(p.parts) > 1:
                tops.add(p.parts[1])
    return tops


def split(chain: Sequence[str], store: LayerStore | Path) -> Split:
    """The image's layer chain as (lower, upper): upper is the run of thin top layers found in the store
    (the app and the spec). A dependency layer (one that installs into the venv, runtime/contract.py
    VENV; the build keeps some in the store too) or a big layer ends the run: it belongs in the cache,
    squashed once, not in every append. So the lower chain is the deps stage's, the chain the cache is
    keyed on (tests/test_enroot_incremental.py checks it against a pushed image)."""
    store = LayerStore.of(store)
    upper: list[Path] = []
    tops: set[str] = set()
    venv_top = VENV.strip("/").split("/", 1)[0]
    for diff_id in reversed(chain):
        path = store.tar(diff_id)
        if not path.is_file() or path.stat().st_size >= BIG_LAYER_BYTES or _sha256_file(path) != diff_id:
            break
        touched = _tops_of(path)
        if venv_top in touched:
            break
        upper.insert(0, path)
        tops |= touched
    if not upper:
        raise Fallback(f"the image's top layer is not in the layer store {store} (built elsewhere?)")
    lower = list(chain[:len(chain) - len(upper)])
    if not lower:
        raise Fallback("every layer of the image is in the layer store: nothing below to cache")
    return Split(lower, upper, tops)


def cache_key(lower_chain: Sequence[str], options: Sequence[str]) -> str:
    doc = json.dumps({"format": FORMAT, "chain": list(lower_chain), "options": list(options)}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def _find_image_with_chain(client, chain: list[str]) -> Optional[str]:
    for img in client.images.list():
        if (img.attrs.get("RootFS") or {}).get("Layers") == chain:
            return img.id
    return None


def _needed_hot(sp: Split, config: dict, lower_dirs: set[str]) -> set[str]:
    hot = set(sp.tops) | set(ALWAYS_HOT)
    workdir = (config.get("WorkingDir") or "/").strip("/")
    if workdir and workdir not in lower_dirs:
        hot.add(workdir.split("/", 1)[0])  # enroot creates it: that top-level directory changes
    return hot


class LowerCache:
    """<out_dir>/.lower/<key>/{base.sqsh, hot/, meta.json}: the lower chain, squashed once."""

    def __init__(self, out_dir: Path, key: str):
        self.root = out_dir / ".lower"
        self.dir = self.root / key

    @property
    def meta(self) -> Optional[dict]:
        try:
            return json.loads((self.dir / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    def build(self, client, lower_image: str, hot_for: Callable[[set[str]], set[str]], options: Sequence[str],
              progress: Optional[Callable[[str], None]]) -> dict:
        """Export the lower image, fix it up, move the hot top-level entries (`hot_for(the lower
        image's directories)`) aside, squash the rest."""
        self.root.mkdir(parents=True, exist_ok=True)
        size = int(client.images.get(lower_image).attrs.get("Size") or 0)
        diskspace.require(self.root, 2 * size, "caching the lower layers' squashfs (extracted, then squashed)")
        work = Path(tempfile.mkdtemp(prefix=f".{self.dir.name}.", dir=self.root))
        try:
            rootfs = work / "rootfs"
            rootfs.mkdir()
            rootfs.chmod(0o755)
            t0 = time.monotonic()
            # working_dir "/": the engine adds the container's WorkingDir to the export, and the lower
            # image's is not the final image's (enroot's configure makes the final one, in the stage)
            enroot.export_rootfs(client, lower_image, rootfs, progress, working_dir="/")
            enroot.fix_permissions(rootfs)
            dirs = sorted(os.path.relpath(d, rootfs) for d, _, _ in os.walk(rootfs) if d != str(rootfs))
            hot = hot_for(set(dirs))
            (work / "hot").mkdir()
            for name in sorted(hot):
                if os.path.lexists(rootfs / name):
                    os.rename(rootfs / name, work / "hot" / name)
            if progress:
                progress(f"lower layers extracted in {time.monotonic() - t0:.1f}s; squashing them once "
                         f"(all but /{', /'.join(sorted(hot))})")
            enroot.mksquashfs(rootfs, work / "base.sqsh", options)
            shutil.rmtree(rootfs)
            meta = {"hot": sorted(hot), "dirs": dirs, "options": list(options), "build_id": os.urandom(8).hex()}
            (work / "meta.json").write_text(json.dumps(meta))
            if self.dir.exists():
                old = Path(tempfile.mkdtemp(prefix=".old.", dir=self.root))
                os.rename(self.dir, old / "x")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(work, self.dir)
            return meta
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def touch_and_prune(self) -> None:
        """Mark this cache used; drop all but the KEEP_CACHES most recently used (another deploy
        may be replacing or pruning them at the same time: that is not an error)."""
        try:
            os.utime(self.dir)
            caches = sorted((p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                            key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return
        for stale in caches[KEEP_CACHES:]:
            shutil.rmtree(stale, ignore_errors=True)


def _stage(cache: LowerCache, sp: Split, config: dict, hot: set[str], dest: Path) -> None:
    """hot/ + the upper layers + enroot's fix-up and config files, as the tree to append."""
    dest.mkdir()
    dest.chmod(0o755)
    res = subprocess.run(["cp", "-a", f"{cache.dir / 'hot'}/.", f"{dest}/"], capture_output=True, text=True)
    if res.returncode != 0:
        raise Fallback(f"copying the cached top-level directories failed: {res.stderr.strip()[-300:]}")
    for layer in sp.upper:
        res = subprocess.run(["tar", "-C", str(dest), "--warning=no-timestamp", "--anchored", *enroot.EXCLUDES,
                              "-px", "-f", str(layer)], capture_output=True, text=True)
        if res.returncode != 0:
            raise Fallback(f"layer {layer.name} does not apply as a plain overlay: {res.stderr.strip()[-300:]}")
    enroot.fix_permissions(dest)
    workdir_top = (config.get("WorkingDir") or "/").strip("/").split("/", 1)[0]
    enroot.configure(dest, config, make_workdir=not workdir_top or workdir_top in hot)
    stray = set(os.listdir(dest)) - hot
    if stray:
        raise Fallback(f"the staged tree has top-level entries outside the cached split: {sorted(stray)}")


def _spare(cache: LowerCache, meta: dict) -> Path:
    """The ready copy of this build of base.sqsh (named by the build's id: a copy of a base that was
    since rebuilt under the same key is never taken)."""
    return cache.dir / f"spare-{meta['build_id']}.sqsh"


def _take_base_copy(cache: LowerCache, meta: dict, out: Path) -> str:
    """Put a copy of the cached squashfs at OUT: the spare copy when one is ready (a rename), else a
    copy now. Returns how ("spare" or "copied"). The copy is the cost left on filesystems that do
    not share extents (ext4: the whole image, 6.6 GB for the cpu one, at disk speed); `cp
    --reflink=auto` makes it a metadata operation on XFS with reflink or btrfs."""
    try:
        os.rename(_spare(cache, meta), out)  # atomic: of two concurrent conversions, one gets it
        return "spare"
    except FileNotFoundError:
        pass
    diskspace.require(out.parent, (cache.dir / "base.sqsh").stat().st_size, "copying the cached squashfs to append to")
    res = subprocess.run(["cp", "--reflink=auto", str(cache.dir / "base.sqsh"), str(out)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise DeployError(f"copying the cached squashfs failed: {res.stderr.strip()[-300:]}")
    return "copied"


class NoRoom(Exception):
    """The spare copy was not started: the disk would be left with less than the margin."""


def prepare_spare(cache: LowerCache, meta: dict) -> Optional[int]:
    """Copy base.sqsh to the spare in a detached process (it outlives this command), so the next code
    change skips the copy. Written under a temporary name that carries the copying shell's pid and
    renamed: a spare is whole or absent, and a partial one whose copier is gone is removed by the next
    conversion (remove_stale_partials). Returns the copying process' pid, or None when a spare is ready
    already; NoRoom when the copy plus the margin does not fit."""
    spare = _spare(cache, meta)
    if spare.exists():
        return None
    remove_stale_partials(cache.dir)
    size = (cache.dir / "base.sqsh").stat().st_size
    if not diskspace.room(cache.dir, size):
        raise NoRoom(f"no spare copy for the next change: it needs {diskspace.gib(size)} and "
                     f"{diskspace.gib(diskspace.MARGIN_BYTES)} left free, {diskspace.gib(diskspace.free_bytes(cache.dir))} "
                     "is free (the next change copies it then)")
    script = 'tmp="$2/.spare.$$.partial"; cp --reflink=auto -- "$1" "$tmp" && mv -f -- "$tmp" "$3" || rm -f -- "$tmp"'
    proc = subprocess.Popen(["sh", "-c", script, "spare", str(cache.dir / "base.sqsh"), str(cache.dir), str(spare)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    return proc.pid


def remove_stale_partials(directory: Path) -> list[Path]:
    """Delete `.spare.<pid>.partial` files whose copying shell is gone (killed, or the machine restarted)."""
    removed = []
    for f in directory.glob(".spare.*.partial"):
        pid = f.name.split(".")[2]
        if pid.isascii() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            f.unlink(missing_ok=True)
            removed.append(f)
    return removed


def _append(stage: Path, out: Path) -> None:
    argv = ["mksquashfs", str(stage), str(out), "-all-root", "-no-recovery", "-exit-on-error", "-no-progress",
            "-processors", str(os.cpu_count() or 1)]
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise DeployError(f"mksquashfs (append) failed ({res.returncode}): {res.stderr.strip()[-500:]}")


def convert(client, img, out: Path, store: LayerStore | Path, options: Sequence[str] = enroot.ENROOT_DEFAULT_OPTIONS,
            progress: Optional[Callable[[str], None]] = None, spare: bool = True) -> tuple[float, float]:
    """Write OUT (the .sqsh of engine image `img`) incrementally; returns (cache seconds, append seconds).
    With `spare`, the copy the next conversion needs is made in the background afterwards.
    Raises Fallback (nothing written) when this image needs a full conversion."""
    config = img.attrs.get("Config") or {}
    sp = split(img.attrs["RootFS"]["Layers"], store)
    cache = LowerCache(out.parent, cache_key(sp.lower_chain, options))
    t0 = time.monotonic()
    meta = cache.meta
    if meta is None or not _needed_hot(sp, config, set(meta["dirs"])) <= set(meta["hot"]):
        lower_image = _find_image_with_chain(client, sp.lower_chain)
        if lower_image is None:
            raise Fallback("no local image has the layers below the app layer (and no cache of them exists)")
        if progress:
            progress(f"caching the squashfs of the {len(sp.lower_chain)} lower layers (once per lower chain)")
        earlier = set((meta or {}).get("hot", []))  # keep serving the images the old cache served
        meta = cache.build(client, lower_image, lambda dirs: _needed_hot(sp, config, dirs) | earlier, options,
                           progress)
    hot = set(meta["hot"])
    t1 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _stage(cache, sp, config, hot, work / "stage")
        t2 = time.monotonic()
        partial = work / "image.sqsh"
        how = _take_base_copy(cache, meta, partial)
        t3 = time.monotonic()
        _append(work / "stage", partial)
        os.replace(partial, out)
        if progress:
            progress(f"incremental .sqsh: staged /{', /'.join(sorted(hot))} in {t2 - t1:.2f}s, "
                     f"{'took the spare copy of' if how == 'spare' else 'copied'} the cached squashfs in "
                     f"{t3 - t2:.2f}s, appended in {time.monotonic() - t3:.2f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cache.touch_and_prune()
    try:
        pid = prepare_spare(cache, meta) if spare else None
    except NoRoom as e:
        pid = None
        if progress:
            progress(str(e))
    if pid and progress:
        progress(f"copying the cached squashfs for the next change in the background (pid {pid})")
    return t1 - t0, time.monotonic() - t1

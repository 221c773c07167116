"""The .sqsh of an image, by the cheapest honest path: a file already made for this digest, the
incremental path (deploy/targets/pyxis/enroot_incremental.py: the layers below the app squashed once
and cached, the rest appended), or a full conversion (deploy/targets/pyxis/enroot.py's primitives, as
`enroot import dockerd://` makes it). The primitives know nothing of the paths built on them."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import docker

from deploy import engine_pull, hint
from deploy.job import DeployError
from deploy.layer_store import LayerStore
from deploy.targets.pyxis import diskspace
from deploy.targets.pyxis import enroot_incremental as inc
from deploy.targets.pyxis.enroot import ENROOT_DEFAULT_OPTIONS, make_rootfs, mksquashfs, sqsh_name


@dataclass(frozen=True)
class SquashResult:
    path: Path
    cached: bool
    seconds: float                # the whole call: a load or pull of the image into the engine included
    export_seconds: float = 0.0   # the image extracted (a full conversion) or its lower layers cached
    squash_seconds: float = 0.0
    how: str = "full"      # "full", "incremental" (deploy/targets/pyxis/enroot_incremental.py) or "cached"
    note: str = ""         # why an incremental conversion fell back to a full one


def convert(client, image: str, out_dir: Path, *, digest: Optional[str] = None,
            options: Sequence[str] = ENROOT_DEFAULT_OPTIONS, progress=None,
            layer_store: LayerStore | Path | None = None, spare: bool = True,
            from_build: Optional[engine_pull.FromBuild] = None) -> SquashResult:
    """The image (any local reference) as OUT_DIR/<repo>+<digest>.sqsh; reused when it exists.

    `client`: a Docker client, or a function that returns one, called only when the file must be made:
    with the digest given, a cached file is found without the engine (a login node without Docker).

    With `layer_store` (where the build keeps the layers it assembled), the layers below those are
    squashed once and cached, and the rest is appended (enroot_incremental.py); where that cannot be
    done honestly, a full conversion runs and `note` says why. `spare`: after an incremental
    conversion, copy the cached part for the next one in the background (enroot_incremental.prepare_spare).
    `from_build`: where the engine lacks the pushed image, it is loaded from this machine's build before a pull
    is tried (deploy/engine_pull.py)."""
    t0 = time.monotonic()
    if digest and (Path(out_dir) / sqsh_name(image, digest)).exists():  # a cached file needs no engine
        return SquashResult(Path(out_dir) / sqsh_name(image, digest), True, time.monotonic() - t0, how="cached")
    if callable(client):
        try:
            client = client()
        except Exception as e:
            raise DeployError(f"making {sqsh_name(image, digest) if digest else 'the .sqsh'} needs the Docker engine, "
                              f"and {e}. Run this deploy where the engine is reachable (the file is then cached "
                              f"in {out_dir}), or copy a made .sqsh there") from None
    try:  # the pushed image, loaded or pulled where the engine lacks it (one built from the registry: toolchain/image/way.py)
        img = engine_pull.image(client, image, progress, from_build) if digest else client.images.get(image)
    except engine_pull.PullError:
        raise
    except docker.errors.ImageNotFound:  # a local name the engine lacks: nothing to pull it by
        raise DeployError(f"image {image!r} is not in the local engine; run `{hint.cmd('build')}` first") from None
    except Exception as e:  # noqa: BLE001 - the engine's answer, said with the image
        raise DeployError(f"image {image!r}: the local engine did not give it ({e})") from None
    out = Path(out_dir) / sqsh_name(image, digest or img.id)
    if out.exists():
        return SquashResult(out, True, time.monotonic() - t0, how="cached")
    out.parent.mkdir(parents=True, exist_ok=True)
    note = ""
    if layer_store is not None:
        try:
            cache_s, append_s = inc.convert(client, img, out, LayerStore.of(layer_store), options, progress, spare)
            return SquashResult(out, False, time.monotonic() - t0, cache_s, append_s, how="incremental")
        except inc.Fallback as e:
            note = f"full conversion: {e}"
            if progress:
                progress(note)
    # the extracted image, then its squashfs beside it
    diskspace.require(out.parent, 2 * int(img.attrs.get("Size") or 0), f"converting {image} to {out.name}")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        partial = work / "image.sqsh"
        if progress:
            progress(f"converting {image} ({img.attrs.get('Size', 0) / 2**30:.2f} GiB, {' '.join(options)}) -> {out.name}")
        t_export = time.monotonic()  # after the engine got the image (a load or a pull: said on their own)
        make_rootfs(client, img.id, img.attrs.get("Config") or {}, work / "rootfs", progress)
        t1 = time.monotonic()
        if progress:
            progress(f"extracted in {t1 - t_export:.1f}s; mksquashfs")
        mksquashfs(work / "rootfs", partial, options)
        t2 = time.monotonic()
        os.replace(partial, out)  # same filesystem: the .sqsh appears whole or not at all
        return SquashResult(out, False, time.monotonic() - t0, t1 - t_export, t2 - t1, note=note)
    finally:
        shutil.rmtree(work, ignore_errors=True)

"""A pushed image put in this machine's engine from what its build left here, before any pull
(deploy/engine_pull.py `image`; the local target and `--sqsh` ask for it).

The layers come from the layer store's tars or, where the push dropped a tar, from its compressed blob (the
engine reads a gzip layer as it reads a tar, and checks its diff ID either way). Only the layers above the
longest chain the engine already holds travel (toolchain/image/deps_stage.py `held_prefix`), in one
docker-archive; then the pushed reference is recorded (engine_pull.record: the manifest and the config are
fetched, nothing else).

Why not the pull: the engine knows a layer it loaded by its diff ID only, never by the registry's blob
digest, so a pull downloads and applies again every layer that came by a load. The gpu image made for the
registry (toolchain/image/way.py) shares every layer but its top ones with the cpu image the build loaded:
here it is one small load, where the pull was 4.2 GiB and 93 s. Where the build left too little (a layer
taken from the registry and never written here, a pruned blob), nothing is loaded and the pull does it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from deploy import engine_pull
from deploy.layer_store import LayerStore
from toolchain.errors import BuildError
from toolchain.image import layers
from toolchain.image.deps_stage import engine_chains, held_prefix
from toolchain.image.images import layer_store
from toolchain.progress import human_bytes
from toolchain.publish.blobs import BlobCache
from toolchain.publish.push import BLOB_CACHE
from toolchain.records import PushRecord, read_pushes


@dataclass(frozen=True)
class FromBuild:
    """What a build directory's pushes left on this machine; called as an engine_pull.FromBuild."""
    pushed: dict[str, PushRecord]  # by the pushed reference, registry/repository@sha256:...
    store: LayerStore
    blobs: BlobCache
    every_s: float = engine_pull.PROGRESS_EVERY_S  # a line at most this often while the layers go

    @classmethod
    def of(cls, build_dir: Path, pushes: Optional[dict[str, PushRecord]] = None) -> "FromBuild":
        """BUILD_DIR's; PUSHES: its push records (build/images.json), where the caller has read them."""
        pushes = read_pushes(build_dir) if pushes is None else pushes
        return cls({r.ref.docker(): r for r in pushes.values()}, layer_store(build_dir), BlobCache(build_dir / BLOB_CACHE))

    def _file(self, diff_id: str) -> Optional[layers.FileLayer]:
        """The layer's tar, or its compressed blob, as a file to send; None where neither is here."""
        size = self.store.tar_size(diff_id)
        if size is not None:
            return layers.FileLayer(self.store.tar(diff_id), diff_id, size)
        blob = self.blobs.get(diff_id)
        return layers.FileLayer(blob.path, diff_id, blob.size) if blob is not None else None

    def __call__(self, client, ref: str, say: Callable[[str], None]) -> bool:
        record = self.pushed.get(ref)
        config = self.store.read_config(record.image_id) if record is not None else None
        if config is None:
            return False
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        held = held_prefix(engine_chains(client), diff_ids)
        files = [self._file(d) for d in diff_ids[held:]]
        lacking = sum(f is None for f in files)
        if lacking:
            say(f"this machine's build lacks {lacking} of the {len(files)} layer(s) the engine needs for {ref} "
                "(taken from the registry, never written here): it is pulled")
            return False
        total = sum(f.size for f in files)
        say(f"loading {ref} into the engine from this machine's build: {len(files)} layer(s), "
            f"{human_bytes(total)} (the engine holds the {held} below)")
        t0 = last = time.monotonic()
        sent, applied = 0, {}  # bytes of the archive sent; per layer the engine applies: done

        def tick() -> None:  # the engine takes the archive, then applies its layers (the long part): said every few s
            nonlocal last
            if time.monotonic() - last >= self.every_s:
                last = time.monotonic()
                say(f"loading: {human_bytes(min(sent, total))} of {human_bytes(total)} sent, "
                    f"{sum(applied.values())} of {len(files)} layer(s) applied ({last - t0:.0f}s)")

        def taking(n: int) -> None:
            nonlocal sent
            sent = n
            tick()

        def applying(event: dict) -> None:
            detail = event.get("progressDetail") or {}
            applied[event.get("id", "")] = bool(detail.get("total")) and detail.get("current", 0) >= detail["total"]
            tick()
        try:  # tagged as a build here tags it
            layers.load_images(client, files, [(config, record.local_ref.docker())], progress=taking, applying=applying)
        except (BuildError, OSError) as e:  # a blob pruned meanwhile, a tar that is not its layer
            say(f"loading {ref} from this machine's build failed ({str(e)[:300]}); pulling it instead")
            return False
        failed = engine_pull.record(client, ref)
        say(f"loaded {ref} in {time.monotonic() - t0:.1f}s" +
            (f"; the engine did not record its reference ({failed[:200]}), so it is pulled" if failed else ""))
        return failed is None

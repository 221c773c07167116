"""Where a pushed image's layers and config come from, compressed into the blob cache (toolchain/publish/blobs.py).

In order: the blob cache itself (compressed before, for any registry); the build's layer store
(<build_dir>/layers/<diff id hex>.tar, every layer the build assembled, and <image id hex>.json, the
config of every image it assembled); else `docker save` of the smallest local image that holds the
layer (the caller's candidates, smallest first, then the image itself), streamed: only the layers
still needed are compressed, straight into the cache, their diff ID checked, and the stream is
closed as soon as nothing more is needed. Two save formats are read: the OCI layout of Docker 25+
(blobs/sha256/<diff id hex>) and the legacy one of older engines (<v1 id>/layer.tar, named by no
digest: a layer.tar whose size is that of a layer already at hand is only hashed, any other is
compressed and kept under its own diff ID).
"""
from __future__ import annotations

import hashlib
import re
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Sequence

import docker

from deploy.layer_store import LayerStore
from runtime.digest import Digest
from toolchain.publish.blobs import Blob, BlobCache, LayerMismatch
from toolchain.errors import ToolchainError
from toolchain.progress import Reporter, human_bytes
from deploy import hint

_OCI_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")
_LEGACY_CONFIG = re.compile(r"([0-9a-f]{64})\.json")


@dataclass
class CompressStats:
    layers: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0  # the layers' compression times summed (several run at once in a push)


class LayerSource:
    def __init__(self, client: docker.DockerClient, cache: BlobCache, image_id: str, store: LayerStore | Path | None,
                 candidates: Sequence[str], rep: Reporter):
        self.client, self.cache, self.image_id = client, cache, Digest(image_id, "image ID")
        self.store = LayerStore.of(store) if store is not None else None
        self.candidates, self.rep = list(candidates), rep
        self.stats = CompressStats()
        self._stats_lock = threading.Lock()
        self._config: Optional[bytes] = None

    # -- what the push asks for ----------------------------------------------------------------------
    def config(self) -> bytes:
        """The image's config bytes (their sha256 is the image ID)."""
        if self._config is None and self.store is not None:
            self._config = self.store.read_config(self.image_id)
        if self._config is None:
            self._from_saves([], want_config=True)
        return self._config

    def blobs(self, diff_ids: Sequence[str]) -> dict[str, Blob]:
        """The cached blob of each layer, compressing those not cached yet."""
        out: dict[str, Blob] = {}
        missing = []
        for d in dict.fromkeys(diff_ids):
            blob = self.cache.get(d)
            if blob is None and self.store is not None and self.store.has_tar(d):
                tar = self.store.tar(d)
                try:
                    with open(tar, "rb") as f:
                        blob = self._compress(f, d, tar.stat().st_size, "from the layer store")
                except LayerMismatch as e:
                    self.rep.warn(f"{tar}: {e}; reading the layer from the engine instead")
            if blob is None:
                missing.append(d)
            else:
                out[d] = blob
        if missing:
            out.update(self._from_saves(missing, want_config=False))
        return out

    def stored_tar(self, diff_id: str) -> Optional[Path]:
        """The layer's tar in the layer store when its blob is not cached yet (the push compresses it while
        uploading it: toolchain/publish/push.py), else None."""
        if self.store is None or self.cache.get(diff_id) is not None:
            return None
        tar = self.store.tar(diff_id)
        return tar if tar.is_file() else None

    def tar_size(self, diff_id: str) -> Optional[int]:
        """The size of the layer's tar in the layer store (its uncompressed size), None when it is not there."""
        return self.store.tar_size(diff_id) if self.store is not None else None

    def compress_stored(self, tar: Path, diff_id: str, tee: Callable[[bytes], None], doing: str) -> Blob:
        """Compress a stored layer tar into the cache, each block of the blob also given to `tee`;
        LayerMismatch when the file is not that layer any more."""
        with open(tar, "rb") as f:
            return self._compress(f, diff_id, tar.stat().st_size, "from the layer store", tee, doing)

    def from_engine(self, diff_ids: Sequence[str]) -> dict[str, Blob]:
        """The layers' blobs compressed from `docker save` (the layer store's copy was not the layer)."""
        return self._from_saves(list(diff_ids), want_config=False)

    # -- compressing ---------------------------------------------------------------------------------
    def _compress(self, src: BinaryIO, expect: Optional[str], size: int, where: str,
                  tee: Optional[Callable[[bytes], None]] = None, doing: str = "compressing") -> Blob:
        name = Digest(expect).short if expect else "a layer"
        t0 = time.monotonic()
        try:
            blob = self.cache.put(src, expect, lambda done: self.rep.progress(f"{doing} {name}", done, size), tee)
        finally:
            self.rep.progress_done()
        dt = time.monotonic() - t0
        with self._stats_lock:  # the push compresses several layers at once
            self.stats.layers += 1
            self.stats.bytes_in += blob.diff_size
            self.stats.bytes_out += blob.size
            self.stats.seconds += dt
        self.rep.detail(f"{blob.diff_id.short}: compressed {human_bytes(blob.diff_size)} to {human_bytes(blob.size)} "
                        f"in {dt:.1f}s ({blob.diff_size / max(dt, 1e-6) / 1e6:.0f} MB/s) {where}")
        return blob

    # -- docker save ---------------------------------------------------------------------------------
    def _from_saves(self, missing: list[str], want_config: bool) -> dict[str, Blob]:
        if self.client is None:  # a build with no engine: what the store and the registry lack is nowhere
            what = f"layer(s) {', '.join(Digest(d).short for d in missing)}" if missing else "the image config"
            raise ToolchainError(f"{what} of image {self.image_id.short} are neither in the blob cache, the layer store "
                                 f"({self.store}) nor in the registry, and no engine here holds them; build it again: "
                                 f"{hint.cmd('build')}")
        found: dict[str, Blob] = {}
        # without the config at hand the image itself is saved anyway: it holds every layer too
        config_later = self._config is None and self._config_missing()
        refs = [self.image_id] if want_config or config_later else [*self.candidates, self.image_id]
        for ref in refs:
            need = {d for d in missing if d not in found}
            if not need and not (want_config and self._config is None):
                break
            try:
                image = self.client.images.get(ref)
            except (docker.errors.ImageNotFound, docker.errors.APIError):
                continue
            has = need & set(image.attrs["RootFS"]["Layers"])
            config_here = self._config is None and image.id == self.image_id  # taken on the way when it is there
            if has or (config_here and want_config):
                found.update(self._save(ref, image.attrs["RootFS"]["Layers"], has, config_here))
        lost = [d for d in missing if d not in found]
        if lost or (want_config and self._config is None):
            what = f"layer(s) {', '.join(Digest(d).short for d in lost)}" if lost else "the image config"
            raise ToolchainError(f"{what} of image {self.image_id.short} are neither in the blob cache "
                                 f"({self.cache.root}), the layer store ({self.store}) nor in a local image "
                                 f"({', '.join(refs)}); build it again: {hint.cmd('build')}")
        return found

    def _config_missing(self) -> bool:
        return self.store is None or not self.store.has_config(self.image_id)

    def _known_sizes(self, layers: Sequence[str], need: set) -> set:
        """Sizes of the image's layers that are already at hand (a legacy save does not name them)."""
        sizes = set()
        for d in layers:
            if d in need:
                continue
            blob = self.cache.get(d)
            if blob is not None:
                sizes.add(blob.diff_size)
            elif self.store is not None and (size := self.store.tar_size(d)) is not None:
                sizes.add(size)
        return sizes

    def _save(self, ref: str, layers: Sequence[str], need: set, want_config: bool,
              skip: bool = True) -> dict[str, Blob]:
        need = set(need)
        skip_sizes = self._known_sizes(layers, need) if skip else set()
        self.rep.step(f"push: reading {len(need)} layer(s){' and the config' if want_config else ''} "
                      f"from `docker save {ref}`")
        api = self.client.api
        res = api._get(api._url("/images/{0}/get", ref), stream=True)  # the SDK's get_image, as a closable stream
        try:
            api._raise_for_status(res)
            got, again = self.read_save(res.raw, f"`docker save {ref}`", need, want_config, skip_sizes)
        except docker.errors.APIError as e:
            raise ToolchainError(f"`docker save {ref}` failed: {e}") from None
        except (tarfile.TarError, OSError) as e:
            raise ToolchainError(f"`docker save {ref}` gave an unreadable stream ({type(e).__name__}: {e})") from None
        finally:
            res.close()  # the engine stops sending what was not read
        if again:
            self.rep.detail(f"a layer of the size of one at hand is needed after all; reading `docker save {ref}` again")
            got.update(self._save(ref, layers, need, want_config, skip=False))
        return got

    def read_save(self, stream: BinaryIO, where: str, need: set, want_config: bool,
                  skip_sizes: set) -> tuple[dict[str, Blob], bool]:
        """Take the needed layers (compressed into the cache; removed from `need`) and, with want_config,
        the image's config from a save's tar stream, stopping as soon as nothing more is needed.
        (blobs, True when a layer only hashed for its size turned out to be needed: read again)."""
        got: dict[str, Blob] = {}
        with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as tf:
            for m in tf:
                if not need and not (want_config and self._config is None):
                    break
                if not m.isfile():  # Docker 25+'s <id>/layer.tar are links into blobs/
                    continue
                oci, legacy_config = _OCI_BLOB.fullmatch(m.name), _LEGACY_CONFIG.fullmatch(m.name)
                if oci and Digest.from_hex(oci[1]) in need:  # OCI layout: named by the diff ID
                    d = Digest.from_hex(oci[1])
                    got[d] = self._compress(tf.extractfile(m), d, m.size, f"from {where}")
                    need.discard(d)
                elif want_config and (oci or legacy_config) and (oci or legacy_config)[1] == self.image_id.hex:
                    self._config = tf.extractfile(m).read()
                elif m.name.endswith("/layer.tar") and need:  # legacy: named by no digest
                    if m.size in skip_sizes:
                        if _sha256(tf.extractfile(m)) in need:
                            return got, True
                        continue
                    blob = self._compress(tf.extractfile(m), None, m.size, f"from {where}")
                    if blob.diff_id in need:
                        got[blob.diff_id] = blob
                        need.discard(blob.diff_id)
        return got, False


def _sha256(f: BinaryIO) -> Digest:
    h = hashlib.sha256()
    while data := f.read(8 << 20):
        h.update(data)
    return Digest.of_hash(h)

"""Push built images to the registry over its HTTP API and record their digests.

The project pushes, not the engine (whose push gzips every layer on one core): each layer is compressed once, on all cores, into the blob cache (toolchain/publish/blobs.py,
from the layer store or `docker save`: toolchain/publish/layer_sources.py), and sent by
the registry package's client (deploy/registry/client.py): a HEAD per blob (present: not sent; in another repository of the
registry: mounted), an upload of each missing one, the config, and a schema2 manifest per tag. A
layer compressed from the layer store is uploaded while it is compressed (a chunked PATCH fed as the
blob is written, then the PUT with its digest, as the engine's own push does), so the upload does not
wait for the whole blob; a stored tar that turns out not to be the layer cancels its upload. Three
layers go at a time (UPLOADS_AT_ONCE). A
layer whose blob digest is already known (this build directory's cache, or the digest index every
build directory shares) and that the registry has is not even compressed. Only changed layers
upload, so a retry resumes: what was uploaded is found by its HEAD and not sent again (the figures:
docs/benchmarks.md, "the cold path"). Transient failures (5xx, resets, a registry that
restarts, a stalled transfer) are retried with backoff; auth failures and a registry that stays
down are reported at once, with the fix. A stall is chosen on purpose: no byte moved for
`registry.stall_timeout_s`. Nothing is tagged in the local engine (a pull by digest of what was
pushed finds the image there and fetches only the manifest and config); a push that did not
finish writes no record.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import docker

from deploy import engine_pull
from deploy.layer_store import LayerStore
from runtime.digest import Digest
from toolchain import cache as user_cache
from toolchain.publish.blobs import Blob, BlobCache, BlobHomes, LayerMismatch
from toolchain.errors import RegistryError, ToolchainError, TransientRegistryError
from toolchain.publish.layer_sources import LayerSource
from toolchain.image.previous_image import HeldBlob, PreviousImageError, held_layers, image_layers
from toolchain.publish.local_registry import share_blob
from toolchain.progress import Reporter, human_bytes
from runtime.imageref import ImageRef
from deploy.registry.client import FileBody, RegistryClient, manifest

__all__ = ["PushResult", "push_image", "BLOB_CACHE"]

BLOB_CACHE = "blobs"  # <build_dir>/blobs/<diff id hex>.gz: each layer compressed once
UPLOADS_AT_ONCE = 3  # layers compressed and uploaded at a time (the engine's own push: 5); measured here, 3 x 600 MB to
                     # the local registry: 117 MB/s one at a time, 165 MB/s three at once
KEEP_TAR_BELOW = 8 << 20  # a pushed layer's tar this small stays in the layer store (the app, the spec: a .sqsh appends them)


@dataclass
class PushResult:
    variant: str
    target: str
    tag: str
    digest: Digest
    repo_digest: ImageRef  # the target pinned by the manifest's digest
    layers_pushed: int = 0
    layers_existing: int = 0
    layers_mounted: int = 0
    bytes_uploaded: int = 0
    attempts: int = 1
    seconds: float = 0.0
    extra_tags: list = field(default_factory=list)
    layers_compressed: int = 0
    bytes_compressed: int = 0   # uncompressed bytes read and compressed by this push (0: all cached)
    compress_seconds: float = 0.0
    upload_seconds: float = 0.0
    bytes_shared: int = 0       # cached blobs stored once with a local registry's copy (share_with)
    layers_known_from_registry: int = 0  # already there, paired with their blobs by the previous image

    def as_dict(self) -> dict:
        return {**asdict(self), "repo_digest": self.repo_digest.docker()}


def default_blob_cache() -> Path:
    return user_cache.part(user_cache.BLOBS)


@dataclass
class _Sent:
    """What this push sent, across its attempts (a blob uploaded by attempt 1 is found by attempt 2)."""
    pushed: set = field(default_factory=set)
    existing: set = field(default_factory=set)
    mounted: set = field(default_factory=set)
    from_registry: set = field(default_factory=set)  # there, known from the previous image, not compressed
    bytes: int = 0
    seconds: float = 0.0  # wall time of the layers' uploads
    shared: int = 0       # bytes of cached blobs made one file with the registry's copy
    halt: threading.Event = field(default_factory=threading.Event)  # set: the uploads in flight stop
    lock: threading.Lock = field(default_factory=threading.Lock)

    def uploaded(self, digest: str, size: int) -> None:
        with self.lock:
            self.pushed.add(digest)
            self.bytes += size


def _send_blob(reg: RegistryClient, blob: Blob, sent: _Sent, rep: Reporter) -> Optional[Digest]:
    """Upload a cached blob; the sha256 of the bytes sent when the registry refused them because they
    are not the blob's (a cache file damaged since it was made), else None."""
    t0 = time.monotonic()
    done = 0
    bodies: list[FileBody] = []

    def progress(n: int) -> None:
        nonlocal done
        done += n
        rep.progress(f"uploading {blob.digest.short}", done, blob.size)

    def body() -> FileBody:
        bodies.append(FileBody(blob.path, blob.size, progress))
        return bodies[-1]
    try:
        reg.upload(blob.digest, body, blob.size, f"layer {blob.digest.short}")
    except RegistryError:
        sent_digest = bodies[-1].digest if bodies else None
        if sent_digest is not None and sent_digest != blob.digest:
            return sent_digest  # the registry checked the digest: the file, not the registry, is wrong
        raise
    finally:
        rep.progress_done()
    sent.uploaded(blob.digest, blob.size)
    dt = time.monotonic() - t0
    rate = blob.size / max(dt, 1e-6) / 1e6
    rep.detail(f"{blob.digest.short}: pushed ({human_bytes(blob.size)}, {dt:.1f}s, {rate:.0f} MB/s)")
    return None


def _push_once(reg: RegistryClient, source: LayerSource, diff_ids: list[Digest], tags: list[str],
               sent: _Sent, rep: Reporter, mount_from: Sequence[str],
               share: Callable[[Blob], None] = lambda blob: None,
               elsewhere: Optional[dict[Digest, tuple[HeldBlob, str]]] = None) -> tuple[str, list[str]]:
    """Every blob the registry lacks, the config, then the manifest under each tag; (the manifest's
    digest, the layers' blob digests).

    A layer whose blob digest is known (compressed before, by any build directory) and that the
    registry has is neither compressed nor sent; the others are compressed (once: the blob cache)
    and uploaded, or mounted from another repository of the registry that has them. Up to
    UPLOADS_AT_ONCE layers go at once (a registry takes several uploads faster than one). A layer of
    ELSEWHERE (diff ID: its blob, the repository of this registry holding it: a build's base) is mounted
    from there, or this one has it; a refused mount is a RegistryError before anything is uploaded."""
    layers: dict[str, tuple[str, int]] = {}
    need = []
    cached = {d: source.cache.known(d) for d in dict.fromkeys(diff_ids)}
    # a fresh runner (a layer whose blob no cache knows): what a previous push left under these tags
    held = held_layers(reg, tags, rep) if None in cached.values() else {}
    for d, (blob, other) in (elsewhere or {}).items():
        if d in cached:
            layers[d] = (blob.digest, blob.size)
            if not _holds(reg, blob, sent):
                _mount_held(reg, blob, other, sent)
    for d, known in cached.items():
        if d in layers:
            continue
        if known is None and d in held and _holds(reg, held[d], sent):
            layers[d] = (held[d].digest, held[d].size)
            continue
        try:
            tar_size = source.tar_size(d) if known is not None else None
            if tar_size is not None and tar_size != known.diff_size:
                raise _NotThatBlob(f"says the layer is {known.diff_size} bytes uncompressed; its tar has {tar_size}")
            if known is not None and _there(reg, known, sent, mount_from):
                layers[d] = (known.digest, known.size)
                share(known)
                continue
        except _NotThatBlob as e:  # a digest cache entry that names another blob: not used, and dropped
            rep.warn(f"the digest cache's entry for layer {d.short} {e}; compressing the layer instead")
            source.cache.drop(d, everywhere=True)
        need.append(d)
    streamed = {d: tar for d in need if (tar := source.stored_tar(d)) is not None}
    blobs = source.blobs([d for d in need if d not in streamed])
    total = sum(streamed[d].stat().st_size if d in streamed else blobs[d].size for d in need)
    t0 = time.monotonic()
    with _Overall(rep, f"pushing {len(need)} layer(s)", total, sent.halt) as overall:
        source.rep = overall
        try:
            for d, blob in _each_at_once(need, lambda d: _push_layer(reg, source, d, streamed.get(d), blobs.get(d),
                                                                     sent, overall, mount_from), sent.halt):
                layers[d] = (blob.digest, blob.size)
                share(blob)
        finally:
            source.rep = rep
    sent.seconds += time.monotonic() - t0
    config = source.config()  # after the layers: a `docker save` of the image for them brings it too
    config_digest = Digest.of(config)
    if not reg.has_blob(config_digest):
        reg.upload(config_digest, lambda: config, len(config), "the image config")
    body = manifest(config, [layers[d] for d in diff_ids])
    digest = None
    for tag in tags:
        digest = reg.put_manifest(tag, body)
    return digest, [layers[d][0] for d in diff_ids]


def _push_layer(reg: RegistryClient, source: LayerSource, d: Digest, tar: Optional[Path], blob: Optional[Blob],
                sent: _Sent, rep: "_Overall", mount_from: Sequence[str]) -> Blob:
    """One layer the registry may lack: compressed from the layer store while it is uploaded (TAR), or its
    cached BLOB uploaded or mounted. The blob the registry now has."""
    if tar is not None:
        streamed = _compress_and_send(reg, source, d, tar, sent, rep)
        if streamed is not None:
            return streamed
        blob = source.from_engine([d])[d]  # the stored tar was not the layer: from the engine, as any other
    try:
        there = _there(reg, blob, sent, mount_from)
    except _NotThatBlob as e:
        rep.warn(f"the cached blob of layer {d.short} {e}; compressing the layer again")
        source.cache.drop(d, everywhere=True)
        blob = source.blobs([d])[d]
        try:
            there = _there(reg, blob, sent, mount_from)
        except _NotThatBlob as again:
            raise RegistryError(f"layer {d.short}: its blob, compressed again, {again}; the registry {reg.host} "
                                "holds a damaged copy of that blob") from None
    if not there:
        # the bytes are checked as they go (hashed while sent; the registry checks them too), not read twice
        damaged = _send_blob(reg, blob, sent, rep)
        if damaged:
            rep.warn(f"the cached blob of layer {d.short} ({blob.path}) is damaged (its bytes hash to "
                     f"{damaged.short}, not {blob.digest.short}); compressing the layer again")
            source.cache.drop(d)
            blob = source.blobs([d])[d]
            if _send_blob(reg, blob, sent, rep):
                raise RegistryError(f"the blob of layer {d.short} was made again and is still not what its "
                                    f"digest says ({blob.path}); check the disk")
    return blob


def _each_at_once(items: Sequence[str], work: Callable[[str], Blob],
                  halt: threading.Event) -> Iterator[tuple[str, Blob]]:
    """(item, work(item)) for each item, UPLOADS_AT_ONCE of them running at a time, in the order they
    finish. The first failure (or an interrupt) cancels what has not started, stops the running ones
    at their next block (HALT) and is raised."""
    if not items:
        return
    halt.clear()
    pool = ThreadPoolExecutor(max_workers=min(UPLOADS_AT_ONCE, len(items)), thread_name_prefix="push-layer")
    futures = {pool.submit(work, d): d for d in items}
    try:
        for f in as_completed(futures):
            yield futures[f], f.result()
    except BaseException:
        for f in futures:
            f.cancel()
        halt.set()
        raise
    finally:
        pool.shutdown(wait=True)
        halt.clear()


class _Overall:
    """The push's one progress line for all the layers in flight (each reports its own count: bytes of
    its tar compressed, or of its blob sent), and the Reporter's lines written one at a time."""

    def __init__(self, rep: Reporter, what: str, total: int, halt: threading.Event):
        self.rep, self.what, self.total, self.halt = rep, what, total, halt
        self.lock = threading.Lock()
        self.each: dict[str, int] = {}

    def __enter__(self) -> "_Overall":
        return self

    def __exit__(self, *exc) -> None:
        self.rep.progress_done()

    def progress(self, what: str, done: int, total: Optional[int] = None) -> None:
        if self.halt.is_set():
            raise _Stopped()
        with self.lock:
            self.each[what] = done
            self.rep.progress(self.what, sum(self.each.values()), self.total)

    def progress_done(self) -> None:
        """One layer's bar ends; the overall line goes on."""

    def step(self, msg: str) -> None:
        with self.lock:
            self.rep.step(msg)

    def detail(self, msg: str) -> None:
        with self.lock:
            self.rep.detail(msg)

    def warn(self, msg: str) -> None:
        with self.lock:
            self.rep.warn(msg)


class _Stopped(Exception):
    """The push was interrupted (Ctrl-C, SIGTERM): the compression stops too, leaving no partial blob."""


class _Pipe:
    """The blob's blocks from the compressing thread to the upload; once the upload is gone the blocks are
    dropped (the compression still finishes into the blob cache, from which a retry sends the blob),
    unless the push itself was interrupted (`stop`)."""
    _END = object()

    def __init__(self, halt: threading.Event):
        self.q: queue.Queue = queue.Queue(maxsize=8)
        self.open = True
        self.stopped = False
        self.halt = halt

    def put(self, block) -> None:
        if self.stopped or self.halt.is_set():
            raise _Stopped()
        self._put(block)

    def _put(self, block) -> None:
        while self.open:
            try:
                self.q.put(block, timeout=1)
                return
            except queue.Full:
                continue

    def end(self) -> None:
        if not self.stopped:
            self._put(self._END)

    def blocks(self) -> Iterator[bytes]:
        while (block := self.q.get()) is not self._END:
            yield block

    def close(self) -> None:
        self.open = False
        while True:  # unblock a put in progress
            try:
                self.q.get_nowait()
            except queue.Empty:
                return


def _compress_and_send(reg: RegistryClient, source: LayerSource, diff_id: Digest, tar: Path, sent: _Sent,
                       rep: Reporter) -> Optional[Blob]:
    """Compress a stored layer into the blob cache and upload the blob as it is made (compression on
    all cores, the upload and the registry's writes beside it: neither waits for the other to end).
    None when the stored tar turned out not to be the layer (the session is cancelled)."""
    diff_id = Digest(diff_id, "layer diff ID")
    pipe, done = _Pipe(sent.halt), {}
    name = diff_id.short

    def compress() -> None:
        try:
            done["blob"] = source.compress_stored(tar, diff_id, pipe.put, "compressing and uploading")
        except BaseException as e:  # noqa: BLE001 - handed to the uploading thread below
            done["error"] = e
        finally:
            pipe.end()
    t0 = time.monotonic()
    worker = threading.Thread(target=compress, name="push-compress", daemon=True)
    worker.start()
    try:
        location = reg.upload_stream(pipe.blocks(), f"layer {name}")
    except Exception:
        pipe.close()
        worker.join()  # the blob is in the cache for the retry
        raise
    except BaseException:  # interrupted: the compression stops at its next block, its partial file removed
        pipe.stopped = True
        pipe.close()
        worker.join()
        raise
    worker.join()
    error = done.get("error")
    if isinstance(error, LayerMismatch):
        reg.cancel_upload(location)
        rep.warn(f"{tar}: {error}; reading the layer from the engine instead")
        return None
    if error is not None:
        reg.cancel_upload(location)
        raise error
    blob = done["blob"]
    reg.finish_upload(location, blob.digest, f"layer {name}")
    sent.uploaded(blob.digest, blob.size)
    _drop_compressed_tars(source.store, source.cache, [diff_id])  # now, not after the push: at its end the
    # image's bytes would be on disk twice beside the registry's copy (7 + 4 GB for the example's image)
    dt = time.monotonic() - t0
    rep.detail(f"{blob.digest.short}: pushed while compressed ({human_bytes(blob.size)}, {dt:.1f}s, "
               f"{blob.size / max(dt, 1e-6) / 1e6:.0f} MB/s)")
    return blob


class _NotThatBlob(Exception):
    """The registry's blob of a cached digest has another size than the cache says it has."""


def _same_size(blob: Blob, size: Optional[int], where: str) -> bool:
    """Whether the registry has the blob (SIZE from its HEAD, None: it has not); a blob of another size
    than the cache entry records means the entry names another layer's blob."""
    if size is None:
        return False
    if size >= 0 and size != blob.size:
        raise _NotThatBlob(f"names blob {blob.digest.short} of {blob.size} bytes, and {where} has it with {size}")
    return True


def _holds(reg: RegistryClient, blob: HeldBlob, sent: _Sent) -> bool:
    """The repository still has a blob its previous image listed, of the size listed. (Each blob there or
    mounted is counted, in the push's line, not said: 43 lines of the same for the example's image.)"""
    size = reg.blob_size(blob.digest)
    if size is None or (size >= 0 and size != blob.size):
        return False
    sent.from_registry.add(blob.digest)
    return True


def _mount_held(reg: RegistryClient, blob: HeldBlob, other: str, sent: _Sent) -> None:
    """Mount a blob the repository OTHER holds (a base's layer); RegistryError when the registry will not."""
    if not (_same_size(blob, reg.blob_size(blob.digest, other), other) and reg.mount(blob.digest, other)):
        raise RegistryError(f"blob {blob.digest.short} of {reg.host}/{other} (a layer of the base): the registry did not "
                            f"mount it into {reg.repo}; give this login pull access to {other}, or copy the base into "
                            f"{reg.repo} and name that copy in image.base_image")
    sent.mounted.add(blob.digest)


def _there(reg: RegistryClient, blob: Blob, sent: _Sent, mount_from: Sequence[str]) -> bool:
    """The registry's repository has the blob, or it was mounted there from another repository; each
    checked against the size the registry gives (`_NotThatBlob` when it differs)."""
    if _same_size(blob, reg.blob_size(blob.digest), reg.repo):
        if blob.digest not in sent.pushed | sent.mounted:
            sent.existing.add(blob.digest)
        return True
    for other in mount_from:
        if _same_size(blob, reg.blob_size(blob.digest, other), other) and reg.mount(blob.digest, other):
            sent.mounted.add(blob.digest)
            return True
    return False


def _layers_of(client: Optional[docker.DockerClient], image_id: Digest, store: Optional[LayerStore]) -> list:
    """The image's diff IDs: from the engine, or (no engine: a build from the registry) from its config in the store."""
    if client is not None:
        return client.images.get(image_id).attrs["RootFS"]["Layers"]
    data = store.read_config(image_id) if store is not None else None
    if data is None:
        raise ToolchainError(f"image {image_id.short}: no engine here, and its config is not in the layer store "
                             f"({store}); build it again")
    return json.loads(data)["rootfs"]["diff_ids"]


def _held_elsewhere(address: str, images: Sequence[ImageRef], stall_s: float,
                    rep: Reporter) -> dict[Digest, tuple[HeldBlob, str]]:
    """Each layer of IMAGES (in ADDRESS's registry) with its blob and the repository that holds it."""
    out: dict[Digest, tuple[HeldBlob, str]] = {}
    for img in images:
        if img.registry != address:
            raise RegistryError(f"{img.docker()}: its layers cannot be mounted into {address}, another registry; "
                                "copy the image there")
        other = RegistryClient(address, img.repository, stall_s)
        try:
            pairs = image_layers(other, str(img.digest or img.tag))
        except PreviousImageError as e:
            raise RegistryError(f"{img.docker()}: {e}") from None
        finally:
            other.close()
        if pairs is None:
            raise RegistryError(f"{img.docker()}: the registry does not have it (any more); push it again, or build "
                                "on another base")
        rep.detail(f"{img.docker()}: {len(pairs)} layer(s) to mount, not read")
        out.update({d: (b, img.repository) for d, b in pairs.items()})
    return out


def _tell_the_engine(client: docker.DockerClient, target: str, digest: str, rep: Reporter) -> None:
    """Make `target@digest` resolve in this engine (engine_pull.record): the local target, `--sqsh` and
    anything else that names the pushed digest here need it."""
    failed = engine_pull.record(client, f"{target}@{digest}")
    if failed is not None:
        rep.warn(f"the engine could not resolve {target}@{digest} after the push ({failed}); a deploy here by that "
                 "digest will pull it (`docker pull` it to see why)")


def _drop_compressed_tars(store: LayerStore, cache: BlobCache, diff_ids: Sequence[str]) -> None:
    """Delete the layer store's tar of each pushed layer whose compressed blob is cached, but the small
    ones: the blob serves every later push, the engine holds the layer, and a build that needs the tar
    again (to load a chain above a changed layer) writes it again, byte for byte (toolchain/image/deps_stage.py)."""
    for d in diff_ids:
        if cache.get(d) is not None:
            store.drop_tar(d, smaller_than=KEEP_TAR_BELOW)


def push_image(client: Optional[docker.DockerClient], variant: str, image_id: str, target: Union[ImageRef, str], tags: list[str],
               retries: int, backoff: float, rep: Reporter, stall_s: float = 300, *,
               layer_store: Union[LayerStore, Path, None] = None, blob_cache: Optional[Path] = None,
               candidates: Sequence[str] = (), mount_from: Sequence[str] = (),
               share_with: Optional[Path] = None, held_from: Sequence[ImageRef] = ()) -> PushResult:
    """Push image_id to target (registry/repository) under each tag; the digest of its manifest.

    Layers come from the blob cache, the layer store, or `docker save` of the candidates (local
    images holding some of its layers, smallest first) and of the image itself. A blob the
    registry has in one of the `mount_from` repositories is mounted, not sent. With `share_with` (the blob
    directory of a registry whose files are on this machine: toolchain/publish/local_registry.py), each cached blob
    becomes one file with the registry's copy as soon as the registry has it. The layers of each image of
    `held_from` (another repository of the same registry: the base of a build with no engine) are mounted
    from it, never read."""
    t0 = time.monotonic()
    where = target if isinstance(target, ImageRef) else ImageRef.parse(target, "push target")
    if where.registry is None or where.tag or where.digest:
        raise RegistryError(f"push target {where.docker()!r}: give registry/repository (the tags come separately)")
    address, repo, target = where.registry, where.repository, where.name
    layer_store = LayerStore.of(layer_store) if layer_store is not None else None
    image_id = Digest(image_id, "image ID")
    diff_ids = [Digest(d, f"a layer of image {image_id}") for d in _layers_of(client, image_id, layer_store)]
    cache = BlobCache(blob_cache or default_blob_cache(), index=user_cache.part(user_cache.BLOB_DIGESTS))
    homes = BlobHomes(user_cache.part(user_cache.BLOB_HOMES))
    known = [b.digest for d in diff_ids if (b := cache.known(d)) is not None]
    mount_from = list(dict.fromkeys([*mount_from, *sorted(r for dg in known for a, r in homes.of(dg)
                                                          if a == address and r != repo)]))
    elsewhere = _held_elsewhere(address, held_from, stall_s, rep)
    mount_from = list(dict.fromkeys([*mount_from, *(img.repository for img in held_from if img.repository != repo)]))
    source = LayerSource(client, cache, image_id, layer_store, candidates, rep)

    def share(blob: Blob) -> None:
        if share_with is not None:
            sent.shared += share_blob(blob, share_with)
    sent = _Sent()
    attempt = 0
    while True:
        attempt += 1
        rep.step(f"push[{variant}]: {target}:{tags[0]} (attempt {attempt})")
        reg = RegistryClient(address, repo, stall_s, mount_from)
        try:
            reg.check()  # a refused login or a registry that is not there, before any compressing
            digest, blob_digests = _push_once(reg, source, diff_ids, tags, sent, rep, mount_from, share, elsewhere)
            break
        except TransientRegistryError as e:
            if attempt > retries:
                raise RegistryError(f"pushing {target}:{tags[0]} failed after {attempt} attempts: {e}") from None
            wait = backoff * 2 ** (attempt - 1)
            rep.warn(f"push {target}:{tags[0]} attempt {attempt} failed ({e}); retrying in {wait:.1f}s "
                     "(layers already uploaded are not sent again)")
            time.sleep(wait)
        finally:
            reg.close()
    if client is not None:
        _tell_the_engine(client, target, digest, rep)
    homes.add(blob_digests, address, repo)
    for gone in cache.prune_big(set(diff_ids)):
        rep.detail(f"removed the cached blob {gone.name} (a big layer of an older build)")
    if layer_store is not None:
        _drop_compressed_tars(layer_store, cache, diff_ids)
    st = source.stats
    return PushResult(variant=variant, target=target, tag=tags[0], digest=digest, repo_digest=where.at(digest),
                      layers_pushed=len(sent.pushed), layers_existing=len(sent.existing),
                      layers_mounted=len(sent.mounted), bytes_uploaded=sent.bytes,
                      layers_known_from_registry=len(sent.from_registry),
                      attempts=attempt, seconds=round(time.monotonic() - t0, 3), extra_tags=list(tags[1:]),
                      layers_compressed=st.layers, bytes_compressed=st.bytes_in,
                      compress_seconds=round(st.seconds, 3), upload_seconds=round(sent.seconds, 3),
                      bytes_shared=sent.shared)

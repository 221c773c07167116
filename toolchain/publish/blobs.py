"""Compressed layer blobs for the registry: one gzip member per layer, compressed on all cores, once per diff ID.

A layer's uncompressed tar (its diff ID is the tar's sha256) becomes the gzip blob the registry stores.
The engine's push gzips on one core; here the input is cut into CHUNK-sized pieces compressed in a thread
pool (ISA-L's deflate, python-isal, releases the GIL) as raw deflate, each primed with the last 32 KiB of
the piece before it and ended with a sync flush (the last one with Z_FINISH), all inside ONE gzip member
(mtime 0, no name; trailer: crc32 and size of the whole input). That is what pigz writes: a standard gzip
stream every consumer reads (Docker, containerd, enroot, Python's gzip). The output depends only on the
input, the level and CHUNK: the same layer gives the same blob digest every time.

The deflate is Intel's ISA-L (the `isal` package, a dependency so every machine makes the same bytes), at
level 2: about 6x zlib's level 1 for blobs 12 % larger, which upload in far less time than the difference
(the figures: docs/registry.md). Memory stays bounded: at most `workers + 3` input chunks are held at once.

The cache is BLOB_DIR/<diff id hex>.gz with a sidecar <diff id hex>.json {digest, size, diff_id,
diff_size, level, chunk}, each written to a temporary name and renamed into place (the sidecar last),
so a push to a second registry, or the same push again, never compresses again.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from isal import isal_zlib

from runtime.digest import Digest, DigestError
from runtime.imageref import ImageRef, ImageRefError
from toolchain.cache import BadEntry, read_entry
from toolchain.atomic import write_atomic
from toolchain.errors import ToolchainError

LEVEL = 2  # ISA-L's levels are 0-3; 2 measured best (docs/registry.md)
CHUNK = 32 << 20
BIG_BLOB = 256 << 20  # prune_big: of the blobs this size and up, those of the image pushed and the
KEEP_BIG = 2          # KEEP_BIG newest others are kept
WINDOW = 32 << 10
HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # gzip, deflate, no flags, mtime 0, xfl 0, OS unknown


@dataclass(frozen=True)
class Blob:
    digest: Digest   # sha256 of the gzip bytes: what the registry names it by
    size: int        # of the gzip bytes
    diff_id: Digest  # sha256 of the uncompressed tar
    diff_size: int   # of the uncompressed tar
    level: int
    chunk: int
    path: Path

    def sidecar(self) -> dict:
        out = asdict(self)
        del out["path"]
        return out


class LayerMismatch(ValueError):
    """The bytes compressed were not the layer asked for (their sha256 is another diff ID)."""


def _deflate(data: memoryview, zdict: Optional[bytes], last: bool, level: int) -> bytes:
    kw = {"zdict": zdict} if zdict else {}
    c = isal_zlib.compressobj(level, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, **kw)
    return c.compress(data) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


def _read_full(src: BinaryIO, n: int) -> bytes:
    """n bytes, fewer only at the end (streams and pipes answer short reads)."""
    first = src.read(n)
    if not first or len(first) == n:
        return first or b""
    parts, got = [first], len(first)
    while got < n:
        more = src.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


@dataclass(frozen=True)
class Gzipped:
    diff_id: Digest
    diff_size: int
    digest: Digest
    size: int


def gzip_stream(src: BinaryIO, dst: BinaryIO, level: int = LEVEL, workers: Optional[int] = None,
                chunk: int = CHUNK, progress: Optional[Callable[[int], None]] = None) -> Gzipped:
    """Compress src into dst as one gzip member, CHUNK-sized pieces in parallel; the input's and the
    output's sha256 and sizes. Deterministic for a given level and chunk size."""
    workers = workers or os.cpu_count() or 1
    in_hash, out_hash = hashlib.sha256(), hashlib.sha256()
    crc = size_in = size_out = 0

    def write(block: bytes) -> None:
        nonlocal size_out
        dst.write(block)
        out_hash.update(block)
        size_out += len(block)

    write(HEADER)
    with ThreadPoolExecutor(workers, thread_name_prefix="gzip") as pool:
        pending: deque = deque()
        tail: Optional[bytes] = None
        cur = _read_full(src, chunk)
        if not cur:
            pending.append(pool.submit(_deflate, memoryview(b""), None, True, level))
        while cur:
            nxt = _read_full(src, chunk)  # read ahead: the last piece is finished, the others sync-flushed
            pending.append(pool.submit(_deflate, memoryview(cur), tail, not nxt, level))
            in_hash.update(cur)
            crc = zlib.crc32(cur, crc)
            size_in += len(cur)
            tail = cur[-WINDOW:]
            while len(pending) > workers:
                write(pending.popleft().result())
            if progress:
                progress(size_in)
            cur = nxt
        while pending:
            write(pending.popleft().result())
    write(struct.pack("<II", crc, size_in & 0xFFFFFFFF))
    return Gzipped(Digest.of_hash(in_hash), size_in, Digest.of_hash(out_hash), size_out)


def file_sha256(path: Path, block: int = 8 << 20) -> Digest:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(block):
            h.update(data)
    return Digest.of_hash(h)


class BlobCache:
    """BLOB_DIR/<diff id hex>.gz and .json: each layer compressed once, whatever registry it goes to.

    With an `index` directory (shared by every build directory of the user), each sidecar is copied
    there too: a build directory that never compressed a layer still knows its blob's digest, and a
    registry that already has that blob is not sent it, nor is the layer compressed for it."""

    def __init__(self, root: Path, level: int = LEVEL, chunk: int = CHUNK, workers: Optional[int] = None,
                 index: Optional[Path] = None):
        self.root, self.level, self.chunk, self.workers = Path(root), level, chunk, workers
        self.index = Path(index) if index is not None else None

    def _paths(self, diff_id: str) -> tuple[Path, Path]:
        hex_ = Digest(diff_id, "layer diff ID").hex
        return self.root / f"{hex_}.gz", self.root / f"{hex_}.json"

    def get(self, diff_id: str) -> Optional[Blob]:
        """The cached blob of a layer, or None when there is none or its entry does not hold together
        (sidecar unreadable, another layer's, or the .gz missing or of another size). The content
        itself is checked as it is sent (toolchain/publish/push.py), or by `verify`."""
        gz, side = self._paths(diff_id)
        blob = _read_sidecar(side, diff_id, gz)
        try:
            return blob if blob is not None and gz.stat().st_size == blob.size else None
        except OSError:
            return None

    def known(self, diff_id: str) -> Optional[Blob]:
        """The blob a layer was compressed to, here or by another build directory (the index): its
        digest and size, its file possibly absent."""
        found = self.get(diff_id)
        if found is None and self.index is not None:
            hex_ = Digest(diff_id, "layer diff ID").hex
            found = _read_sidecar(self.index / f"{hex_}.json", diff_id, self.root / f"{hex_}.gz")
        return found

    def verify(self, blob: Blob) -> bool:
        """Its bytes still hash to the recorded digest (a damaged or truncated file does not)."""
        try:
            return blob.path.stat().st_size == blob.size and file_sha256(blob.path) == blob.digest
        except OSError:
            return False

    def drop(self, diff_id: str, everywhere: bool = False) -> None:
        """Forget the layer's blob here; EVERYWHERE: in the shared index too (an entry found wrong)."""
        for p in reversed(self._paths(diff_id)):  # the sidecar first: without it the entry is gone
            p.unlink(missing_ok=True)
        if everywhere and self.index is not None:
            (self.index / f"{Digest(diff_id, 'layer diff ID').hex}.json").unlink(missing_ok=True)

    def prune_big(self, keep: set, newest: int = KEEP_BIG) -> list[Path]:
        """Delete the blobs of big layers (BIG_BLOB bytes and up) other than those of the layers in `keep`
        and the `newest` most recently made: a requirements change makes a new multi-GB blob, and an
        old one is only a shortcut (its layer is compressed again if it is ever pushed again)."""
        big = []
        for gz in self.root.glob("*.gz"):
            try:
                st = gz.stat()
            except FileNotFoundError:
                continue
            try:
                diff_id = Digest.from_hex(gz.name[:-3])
            except DigestError:
                continue  # not a blob of this cache's naming
            if st.st_size >= BIG_BLOB and diff_id not in keep:
                big.append((st.st_mtime, gz, diff_id))
        gone = sorted(big, reverse=True)[newest:]
        for _, _, diff_id in gone:
            self.drop(diff_id)
        return [gz for _, gz, _ in gone]
        return gone

    def put(self, src: BinaryIO, expect: Optional[str] = None,
            progress: Optional[Callable[[int], None]] = None,
            tee: Optional[Callable[[bytes], None]] = None) -> Blob:
        """Compress a layer tar read from src into the cache; with `expect`, refuse (LayerMismatch) bytes
        whose sha256 is another diff ID. Only a complete, checked blob is renamed into place. `tee` gets
        every block of the blob as it is written (an upload that runs while the layer is compressed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{os.getpid()}.{id(src):x}.partial"
        try:
            try:
                with open(tmp, "wb") as f:
                    out = f if tee is None else _Tee(f, tee)
                    z = gzip_stream(src, out, self.level, self.workers, self.chunk, progress)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                    raise ToolchainError(f"writing a compressed layer into {self.root} failed ({e.strerror}); "
                                         "free space there (old blobs of layers no longer built can go)") from None
                raise
            if expect is not None and z.diff_id != expect:
                raise LayerMismatch(f"the bytes read as layer {expect} have sha256 {z.diff_id}")
            gz, side = self._paths(z.diff_id)
            tmp.replace(gz)
            blob = Blob(z.digest, z.size, z.diff_id, z.diff_size, self.level, self.chunk, gz)
            write_atomic(side, json.dumps(blob.sidecar(), sort_keys=True))
            if self.index is not None:
                self.index.mkdir(parents=True, exist_ok=True)
                write_atomic(self.index / side.name, json.dumps(blob.sidecar(), sort_keys=True))
            return blob
        finally:
            tmp.unlink(missing_ok=True)


class _Tee:
    def __init__(self, f: BinaryIO, tee: Callable[[bytes], None]):
        self.f, self.tee = f, tee

    def write(self, block: bytes) -> None:
        self.f.write(block)
        self.tee(block)


def _home_ok(address: str, repo: str) -> bool:
    """Whether ADDRESS/REPO is a registry and a repository, as an image name has them (no path, query or tag)."""
    try:
        ref = ImageRef.parse(f"{address}/{repo}", "a blob's home")
    except ImageRefError:
        return False
    return ref.registry == address and ref.repository == repo and ref.tag is None and ref.digest is None


def _read_sidecar(side: Path, diff_id: str, gz: Path) -> Optional[Blob]:
    try:
        meta = json.loads(read_entry(side, 64 << 10) or b"null")
        fields = {k: meta[k] for k in ("digest", "size", "diff_id", "diff_size", "level", "chunk")}
        blob = Blob(path=gz, **{**fields, "digest": Digest(fields["digest"]), "diff_id": Digest(fields["diff_id"])})
    except (BadEntry, DigestError, ValueError, KeyError, TypeError, RecursionError):
        return None
    ok = (blob.diff_id == diff_id
          and all(type(v) is int and v > 0 for v in (blob.size, blob.diff_size, blob.chunk)) and type(blob.level) is int)
    return blob if ok else None


class BlobHomes:
    """HOMES/<blob digest hex>.json: the repositories (registry address, repository) a blob was pushed
    to, shared by every build directory of the user, so that a push to another repository of the same
    registry mounts the blob from one of them (the registry API's cross-repository mount) instead of
    uploading it: two projects that use the same wheel store and send its layer once."""

    MAX = 16  # repositories kept per blob, newest last

    def __init__(self, root: Path):
        self.root = Path(root)

    def of(self, digest: str) -> list[tuple[str, str]]:
        """The homes recorded for DIGEST, read as untrusted: only (registry address, repository) pairs that
        parse as one image name, at most MAX (an entry that is not a list of such pairs is no entry)."""
        try:
            data = json.loads(read_entry(self.root / f"{Digest(digest).hex}.json", 64 << 10) or b"[]")
        except (BadEntry, DigestError, ValueError, RecursionError):
            return []
        if not isinstance(data, list):
            return []
        return [(a, r) for a, r in (x for x in data[-self.MAX:] if isinstance(x, list) and len(x) == 2)
                if isinstance(a, str) and isinstance(r, str) and _home_ok(a, r)]

    def add(self, digests, address: str, repo: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for digest in digests:
            homes = [h for h in self.of(digest) if h != (address, repo)] + [(address, repo)]
            write_atomic(self.root / f"{Digest(digest).hex}.json",
                          json.dumps([list(h) for h in homes[-self.MAX:]]))

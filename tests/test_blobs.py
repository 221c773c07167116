"""The push's layer blobs (toolchain/publish/blobs.py): one gzip member made on all cores that every reader
takes back to the exact input, the same bytes every time, a cache that notices damage, and a layer
compressed once however many registries it goes to."""
import gzip
import hashlib
import io
import os
import re
import subprocess
import zlib
from pathlib import Path

import pytest

from helpers.small_image import PlainRegistry, SmallImage, cleanup_pulled, mixed_bytes, small_image
from toolchain.publish.blobs import BlobCache, LayerMismatch, gzip_stream
from toolchain.errors import TransientRegistryError
from toolchain.publish.layer_sources import LayerSource
from toolchain.progress import Reporter
from toolchain.publish.push import _compress_and_send, _Sent, push_image

SMALL_CHUNK = 64 << 10  # many chunks from small inputs: every boundary case in milliseconds


def _gz(data: bytes, **kw) -> bytes:
    out = io.BytesIO()
    z = gzip_stream(io.BytesIO(data), out, **kw)
    assert z.diff_id == "sha256:" + hashlib.sha256(data).hexdigest() and z.diff_size == len(data)
    assert z.digest == "sha256:" + hashlib.sha256(out.getvalue()).hexdigest() and z.size == len(out.getvalue())
    return out.getvalue()


@pytest.mark.parametrize("size", [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, SMALL_CHUNK + 1, 5 * SMALL_CHUNK + 12345])
@pytest.mark.parametrize("level", [1, 3])
def test_parallel_gzip_is_one_member_every_reader_takes_back_to_the_input(tmp_path, size, level):
    data = mixed_bytes(size, seed=size)
    blob = _gz(data, level=level, chunk=SMALL_CHUNK, workers=3)
    assert blob[:4] == b"\x1f\x8b\x08\x00" and blob[4:8] == b"\0\0\0\0"  # gzip, no name, mtime 0
    assert gzip.decompress(blob) == data
    d = zlib.decompressobj(16 + 15)  # exactly one member, nothing after it
    assert d.decompress(blob) == data and d.eof and d.unused_data == b""
    (tmp_path / "b.gz").write_bytes(blob)
    out = subprocess.run(["gzip", "-dc", str(tmp_path / "b.gz")], capture_output=True, check=True).stdout
    assert out == data


def test_matches_reach_back_across_chunks():
    """Each chunk is primed with the previous one's last 32 KiB: a repeat of the previous chunk's tail
    compresses to a reference (a chunk compressed alone would store it again)."""
    block = os.urandom(20000)
    data = block + block  # the second copy starts in the second chunk
    alone = len(_gz(data, chunk=len(block), workers=2))
    assert alone < len(block) + 2000, alone
    assert gzip.decompress(_gz(data, chunk=len(block), workers=2)) == data


def test_same_input_same_bytes_whatever_the_worker_count():
    data = mixed_bytes(9 * SMALL_CHUNK + 77, seed=7)
    one = _gz(data, chunk=SMALL_CHUNK, workers=1)
    assert _gz(data, chunk=SMALL_CHUNK, workers=4) == one == _gz(data, chunk=SMALL_CHUNK, workers=1)
    assert _gz(data, chunk=SMALL_CHUNK, level=3) != one  # the level is part of what the bytes depend on


def test_cache_entry_damage_is_detected(tmp_path):
    cache = BlobCache(tmp_path / "blobs", chunk=SMALL_CHUNK, index=tmp_path / "index")
    data = mixed_bytes(3 * SMALL_CHUNK, seed=3)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    blob = cache.put(io.BytesIO(data), diff_id)
    assert cache.get(diff_id) == blob and cache.verify(blob) and cache.known(diff_id) == blob
    assert gzip.decompress(blob.path.read_bytes()) == data

    raw = bytearray(blob.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one byte flipped: only the digest tells
    blob.path.write_bytes(bytes(raw))
    assert cache.get(diff_id) == blob and not cache.verify(blob)
    blob.path.write_bytes(bytes(raw[:-10]))  # cut short: the entry no longer holds together
    assert cache.get(diff_id) is None
    cache.drop(diff_id)
    assert cache.get(diff_id) is None
    # the index still knows the digest (another build directory's blob), and a new put is the same blob
    assert cache.known(diff_id).digest == blob.digest
    assert cache.put(io.BytesIO(data), diff_id) == blob and cache.verify(blob)

    (tmp_path / "blobs" / f"{diff_id[7:]}.json").write_text("{not json")
    assert cache.get(diff_id) is None


def test_cache_refuses_bytes_of_another_layer(tmp_path):
    cache = BlobCache(tmp_path / "blobs", chunk=SMALL_CHUNK)
    with pytest.raises(LayerMismatch, match="have sha256"):
        cache.put(io.BytesIO(b"not the layer"), "sha256:" + "0" * 64)
    assert list((tmp_path / "blobs").iterdir()) == []  # nothing half-written left behind


class _Registry:
    """The registry side of a streamed upload that takes two blocks of the blob, then ends as told."""

    def __init__(self, error: BaseException):
        self.error, self.took = error, 0

    def upload_stream(self, chunks, what):
        for _ in chunks:
            self.took += 1
            if self.took == 2:
                raise self.error


def _stored_layer(tmp_path) -> tuple[Path, str]:
    store = tmp_path / "layers"
    store.mkdir()
    data = mixed_bytes(4 << 20, 7)  # 64 pieces of SMALL_CHUNK: more than the pipe between the threads holds
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    (store / f"{diff_id[7:]}.tar").write_bytes(data)
    return store, diff_id


@pytest.mark.parametrize("interrupted", [False, True], ids=["upload-failed", "interrupted"])
def test_a_streamed_upload_that_ends_early_leaves_a_whole_blob_or_nothing(tmp_path, interrupted):
    """The push uploads a stored layer while compressing it (toolchain/publish/push.py). An upload that fails
    (a registry gone mid-way) lets the compression finish into the cache, whence the retry sends it; an
    interrupted push (Ctrl-C, SIGTERM) stops the compression too, and no partial file stays."""
    store, diff_id = _stored_layer(tmp_path)
    cache = BlobCache(tmp_path / "blobs", chunk=SMALL_CHUNK)
    source = LayerSource(None, cache, "sha256:" + "1" * 64, store, [], Reporter(quiet=True))
    error = KeyboardInterrupt() if interrupted else TransientRegistryError("connection reset")
    reg = _Registry(error)
    with pytest.raises(type(error)):
        _compress_and_send(reg, source, diff_id, store / f"{diff_id[7:]}.tar", _Sent(), Reporter(quiet=True))
    assert reg.took == 2
    if interrupted:
        assert list((tmp_path / "blobs").iterdir()) == []
    else:
        blob = cache.get(diff_id)
        assert blob is not None and cache.verify(blob)
        assert gzip.decompress(blob.path.read_bytes()) == (store / f"{diff_id[7:]}.tar").read_bytes()


# -- through a real registry and the engine ----------------------------------------------------------

@pytest.fixture
def image(client, tmp_path):
    img = small_image(client, tmp_path / "layers", payload=40 << 20)  # two 32 MiB chunks: a real boundary
    yield img
    img.remove(client)


@pytest.fixture
def two_registries(client, tmp_path):
    regs = [PlainRegistry(tmp_path / "reg-a"), PlainRegistry(tmp_path / "reg-b")]
    yield regs
    for r in regs:
        r.stop()
        cleanup_pulled(client, r.address)


def _push(client, img: SmallImage, address: str, blobs, rep=None):
    return push_image(client, "cpu", img.image_id, f"{address}/raytrain-pushtest", ["t1"], 1, 0.2,
                      rep or Reporter(quiet=True), 60, layer_store=img.store, blob_cache=blobs,
                      candidates=[img.base_ref])


def _pull_back(client, img: SmallImage, repo_digest: str) -> None:
    """Remove the image, pull it by digest, and run it: same ID, the assembled file's content."""
    client.images.remove(img.image_id, force=True)
    pulled = client.images.pull(repo_digest)
    assert pulled.id == img.image_id
    assert client.containers.run(repo_digest, ["cat", "/opt/hello.txt"], remove=True) == img.text
    pulled.tag(*img.ref.split(":"))


def test_a_layer_is_compressed_once_across_pushes_and_registries(client, image, two_registries, tmp_path):
    a, b = two_registries
    blobs = tmp_path / "blobs"
    first = _push(client, image, a.address, blobs)
    assert first.layers_compressed == 2 and first.bytes_compressed > 40 << 20 and first.layers_pushed == 2
    cached = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()}
    assert len([n for n in cached if n.endswith(".gz")]) == 2

    again = _push(client, image, a.address, blobs)
    assert (again.layers_existing, again.layers_pushed, again.bytes_compressed, again.bytes_uploaded) == (2, 0, 0, 0)
    other = _push(client, image, b.address, blobs)
    assert other.bytes_compressed == 0 and other.compress_seconds == 0 and other.layers_pushed == 2
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()} == cached
    assert other.digest == first.digest == again.digest  # same blobs, same config: the same manifest

    _pull_back(client, image, other.repo_digest.docker())


def test_a_damaged_cache_entry_is_made_again(client, image, two_registries, tmp_path):
    a, b = two_registries
    blobs = tmp_path / "blobs"
    first = _push(client, image, a.address, blobs)
    top = max(blobs.glob("*.gz"), key=lambda p: p.stat().st_size)
    raw = bytearray(top.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    top.write_bytes(bytes(raw))
    said = io.StringIO()
    other = _push(client, image, b.address, blobs, Reporter(stream=said))
    assert re.search(r"is damaged \(its bytes hash to \w{12}, not \w{12}\); compressing the layer again", said.getvalue())
    assert other.layers_compressed == 1 and other.digest == first.digest
    # the layer again, its tar no longer in the store (a pushed layer whose blob is cached is dropped there)
    assert hashlib.sha256(gzip.decompress(top.read_bytes())).hexdigest() == top.name[:-3]
    assert not (image.store / f"{top.name[:-3]}.tar").exists()
    _pull_back(client, image, other.repo_digest.docker())


# -- reading `docker save` streams (toolchain/publish/layer_sources.py) ---------------------------------------

def _layer(seed: int, size: int = 3 * SMALL_CHUNK) -> tuple[str, bytes]:
    data = mixed_bytes(size, seed)
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _tar(entries: list) -> bytes:
    """A tar of (name, bytes) files and (name, '->', target) symlinks, in order."""
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for entry in entries:
            info = tarfile.TarInfo(entry[0])
            if entry[1] == "->":
                info.type, info.linkname = tarfile.SYMTYPE, entry[2]
                tf.addfile(info)
            else:
                info.size = len(entry[1])
                tf.addfile(info, io.BytesIO(entry[1]))
    return buf.getvalue()


def _source(tmp_path, config: bytes):
    from toolchain.publish.layer_sources import LayerSource
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    return LayerSource(None, BlobCache(tmp_path / "blobs", chunk=SMALL_CHUNK), image_id, None, [], Reporter(quiet=True))


def test_an_oci_layout_save_gives_the_needed_layers_by_name_and_the_config(tmp_path):
    """Docker 25+ (OCI layout): blobs/sha256/<diff id>; the legacy <id>/layer.tar are links. Only the
    needed layer is compressed; the reading stops once the layer and the config are in hand."""
    (a, a_data), (b, b_data) = _layer(1), _layer(2)
    config = b'{"rootfs":{"type":"layers","diff_ids":["%s","%s"]}}' % (a.encode(), b.encode())
    src = _source(tmp_path, config)
    stream = _tar([("blobs/sha256/" + a[7:], a_data), ("blobs/sha256/" + b[7:], b_data),
                   ("blobs/sha256/" + src.image_id[7:], config), ("0123/layer.tar", "->", "../blobs/sha256/" + b[7:]),
                   ("index.json", b"{}"), ("manifest.json", b"[]")])
    need = {b}
    got, again = src.read_save(io.BytesIO(stream), "a test save", need, True, set())
    assert set(got) == {b} and need == set() and not again and src._config == config
    assert gzip.decompress(got[b].path.read_bytes()) == b_data and src.cache.get(a) is None


def test_a_legacy_save_is_hashed_where_sizes_match_and_read_again_on_a_collision(tmp_path):
    """Engines before 25 name layer.tar by no digest: a layer of the size of one at hand is only hashed;
    one that is needed though its size matched sends the caller back to read the save again."""
    (a, a_data), (b, b_data) = _layer(1), _layer(2, 5 * SMALL_CHUNK)
    config = b'{"rootfs":{"type":"layers","diff_ids":["%s","%s"]}}' % (a.encode(), b.encode())
    src = _source(tmp_path, config)
    stream = _tar([("aaaa/layer.tar", a_data), ("bbbb/layer.tar", b_data), (src.image_id[7:] + ".json", config),
                   ("manifest.json", b"[]")])
    need = {b}
    got, again = src.read_save(io.BytesIO(stream), "a test save", need, True, {len(a_data)})
    assert set(got) == {b} and not again and src._config == config and src.cache.get(a) is None
    assert gzip.decompress(got[b].path.read_bytes()) == b_data

    need = {a}  # needed, and of a size taken for another layer's
    got, again = _source(tmp_path / "2", config).read_save(io.BytesIO(stream), "a test save", need, False,
                                                            {len(a_data)})
    assert got == {} and again and need == {a}
    got, again = _source(tmp_path / "3", config).read_save(io.BytesIO(stream), "a test save", need, False, set())
    assert set(got) == {a} and not again


def test_old_big_blobs_are_pruned_but_the_pushed_image_s_and_the_newest(tmp_path, monkeypatch):
    from toolchain.publish import blobs
    monkeypatch.setattr(blobs, "BIG_BLOB", 1000)
    cache = BlobCache(tmp_path / "blobs", chunk=SMALL_CHUNK)
    made = []
    for i in range(5):
        data = os.urandom(2000 + i)
        made.append(cache.put(io.BytesIO(data)))
        os.utime(made[-1].path, (1_000_000 + i, 1_000_000 + i))  # made in this order
    small = cache.put(io.BytesIO(b"small"))
    gone = cache.prune_big({made[0].diff_id})
    assert sorted(gone) == sorted(b.path for b in made[1:3])
    assert [cache.get(b.diff_id) is not None for b in made] == [True, False, False, True, True]
    assert cache.get(small.diff_id) is not None

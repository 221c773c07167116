"""Push to a real docker-registry over its HTTP API: digests recorded, pull back by digest, failures
leave nothing. The full images go through once (the session's `pushed`); the failure cases push a
small image of their own (tests/helpers/small_image.py): the path through the code is the same."""
import hashlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from conftest import SESSION, SPEC, make_settings
from helpers.small_image import build_record, cleanup_pulled, small_image, write_build
from runtime.spec import spec_hash
from toolchain import pipeline
from toolchain.errors import ConfigError, RegistryError
from toolchain.records import read_pushes
from toolchain.progress import Reporter
from runtime.wait import wait_until


def test_push_records_digest_and_the_registry_serves_every_layer(client, built, pushed, settings):
    """The records, the engine's pull by digest (manifest and config), and every blob the manifest names
    there at its size. A whole pull back, blobs downloaded and unpacked, is test_blobs.py's, on images
    small enough that it takes seconds, not the 2 minutes of this 7 GB one."""
    recorded = {v: r.model_dump() for v, r in read_pushes(settings.build_dir).items()}
    for v in ("cpu", "gpu"):
        entry = recorded[v]
        assert entry["repo_digest"].startswith(f"{settings.registry.address}/{SESSION}-{v}@sha256:")
        assert entry["image_id"] == built[v]["image_id"] and entry["spec_sha256"] == built[v]["spec_sha256"]
        # the engine did not push, so it has no repo digest: a pull by digest finds the image by its ID
        # (the manifest and config only) and records it
        assert client.images.pull(entry["repo_digest"]).id == built[v]["image_id"]
    ref = recorded["cpu"]["repo_digest"]
    # the registry itself serves the manifest under that digest, and every blob it names
    repo, digest = ref.split("/", 1)[1].split("@")
    base = f"http://{settings.registry.address}/v2/{repo}"
    r = requests.get(f"{base}/manifests/{digest}", headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    assert r.status_code == 200 and r.headers["Docker-Content-Digest"] == digest
    manifest = r.json()
    layers = client.images.get(built["cpu"]["image_id"]).attrs["RootFS"]["Layers"]
    assert len(manifest["layers"]) == len(layers) and manifest["config"]["digest"] == built["cpu"]["image_id"]
    for blob in [manifest["config"], *manifest["layers"]]:
        head = requests.head(f"{base}/blobs/{blob['digest']}")
        assert head.status_code == 200 and int(head.headers["Content-Length"]) == blob["size"], blob


def _tags_for(client, prefix):
    return [t for img in client.images.list() for t in img.tags if t.startswith(prefix)]


@pytest.fixture
def small(client, tmp_path):
    """A small runnable image with its layer store, as a build leaves one; removed afterwards."""
    img = small_image(client, tmp_path / "small-layers")
    yield img
    img.remove(client)


def _recorded(s, img) -> None:
    """build.json of settings S records the small image as the cpu build, its layer store the build's."""
    write_build(s.build_dir, {"cpu": build_record(img, spec_hash(SPEC))})
    if not (s.build_dir / "layers").exists():
        (s.build_dir / "layers").symlink_to(img.store)


def test_registry_down_is_clear_and_records_nothing(client, small, tmp_path, app_dir):
    s = make_settings(tmp_path / "w", app_dir, registry_address="127.0.0.1:5999", start_local=False)
    _recorded(s, small)
    with pytest.raises(RegistryError, match="5999.*start_local is false"):
        pipeline.push(s, str(SPEC), "cpu", Reporter())
    assert read_pushes(s.build_dir) == {}
    assert _tags_for(client, "127.0.0.1:5999/") == []


class FaultyProxy:
    """Forwards to the real registry; answers `status` to the first `failures` matching requests."""

    def __init__(self, upstream, method, status, failures, body=b""):
        self.upstream, self.count = upstream, 0
        self.closed = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self):
                data = self._body()
                if self.command == method and proxy.count < failures and status == 0:  # a stalled registry
                    proxy.count += 1
                    proxy.closed.wait(120)
                    return
                if self.command == method and proxy.count < failures:
                    proxy.count += 1
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "content-length")}
                r = requests.request(self.command, f"http://{proxy.upstream}{self.path}", headers=headers, data=data,
                                     allow_redirects=False, stream=True)
                content = r.raw.read()
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.closed.set()
        self.server.shutdown()


@pytest.fixture
def proxied(client, tmp_path, app_dir, small, registry, settings):
    made = []

    def make(method, status, failures, retries, body=b""):
        proxy = FaultyProxy(settings.registry.address, method, status, failures, body)
        made.append(proxy)
        s = make_settings(tmp_path / f"w{len(made)}", app_dir, registry_address=proxy.address, retries=retries)
        _recorded(s, small)
        return s, proxy

    yield make
    for p in made:
        p.close()
        cleanup_pulled(client, p.address)


def test_transient_5xx_is_retried(client, proxied, small):
    s, proxy = proxied("PUT", 503, failures=1, retries=2)
    out = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    assert proxy.count == 1 and out["push"]["attempts"] == 2
    assert read_pushes(s.build_dir)["cpu"].repo_digest.docker().startswith(proxy.address)
    assert client.images.pull(out["repo_digest"]).id == small.image_id


def test_persistent_5xx_fails_without_record_or_tags(client, proxied):
    s, proxy = proxied("PUT", 503, failures=100, retries=1)
    with pytest.raises(RegistryError, match="failed after 2 attempts"):
        pipeline.push(s, str(SPEC), "cpu", Reporter())
    assert read_pushes(s.build_dir) == {}
    assert _tags_for(client, proxy.address + "/") == []


def test_auth_denied_is_clear(client, proxied):
    body = json.dumps({"errors": [{"code": "DENIED", "message": "requested access to the resource is denied"}]}).encode()
    s, proxy = proxied("PUT", 403, failures=100, retries=3, body=body)
    with pytest.raises(RegistryError, match="docker login"):
        pipeline.push(s, str(SPEC), "cpu", Reporter())
    # not retried: each layer in flight when the first refusal came asked once (a retry asks again)
    from toolchain.publish.push import UPLOADS_AT_ONCE
    assert 1 <= proxy.count <= UPLOADS_AT_ONCE
    assert read_pushes(s.build_dir) == {}


def test_stalled_push_is_a_clear_message_not_a_traceback(client, proxied):
    """The registry takes the upload and then says nothing: each attempt gives up after
    registry.stall_timeout_s, the failure names the stall and the setting; nothing is kept."""
    s, proxy = proxied("PUT", 0, failures=100, retries=1)
    s = s.model_copy(update={"registry": s.registry.model_copy(update={"stall_timeout_s": 4})})
    warnings = io.StringIO()
    with pytest.raises(RegistryError, match="(no push progress for 4s|did not finish its answer within 4s).*stall_timeout_s"):
        pipeline.push(s, str(SPEC), "cpu", Reporter(stream=warnings))
    assert "retrying" in warnings.getvalue()
    assert read_pushes(s.build_dir) == {}
    assert _tags_for(client, proxy.address + "/") == []


@pytest.fixture
def big_image(client, tmp_path):
    """A fresh 96 MiB layer of random bytes over a small base: an upload that takes long enough to interrupt."""
    img = small_image(client, tmp_path / "big-layers", payload=96 << 20, random_payload=True)
    yield img
    img.remove(client)


def _big_upload_under_way(data_dir) -> bool:
    """The registry has written 8 MiB of an upload that has not finished (the 96 MiB layer's)."""
    for uploads in Path(data_dir).rglob("_uploads"):
        for data in uploads.glob("*/data"):
            try:
                if data.stat().st_size >= 8 << 20:
                    return True
            except FileNotFoundError:
                pass
    return False


@pytest.mark.parametrize("comes_back", [True, False], ids=["restarted", "gone-for-good"])
def test_registry_killed_mid_upload(client, big_image, tmp_path, app_dir, comes_back):
    from toolchain.publish.push import push_image
    from toolchain.publish.local_registry import start_local, stop_local
    s = make_settings(tmp_path / "w", app_dir, registry_address="127.0.0.1:5088", retries=4)
    s.registry.data_dir = str(tmp_path / "reg")
    start_local(s, Reporter(quiet=True))
    target = f"{s.registry.address}/raytrain-fault"
    out = io.StringIO()

    def push(retries):
        return push_image(client, "cpu", big_image.image_id, target, ["x"], retries, 1.0 if retries else 0.5,
                          Reporter(stream=out), stall_s=60, layer_store=big_image.store,
                          blob_cache=tmp_path / "blobs", candidates=[big_image.base_ref])

    def saboteur():
        wait_until(lambda: _big_upload_under_way(s.registry.data_dir), timeout_s=120, interval_s=0.02,
                   what="the big layer's upload")
        stop_local(s)
        if comes_back:
            time.sleep(1)
            start_local(s, Reporter(quiet=True))
    t = threading.Thread(target=saboteur)
    t.start()
    try:
        if comes_back:
            res = push(4)
            assert res.digest.startswith("sha256:")
            assert res.attempts >= 2 and "retrying" in out.getvalue().lower(), res
            # the retry resumed: each blob went up once in the end, and the image pulls back whole
            assert res.layers_pushed == 2 and res.layers_compressed == 2
            client.images.remove(big_image.image_id, force=True)
            assert client.images.pull(res.repo_digest.docker()).id == big_image.image_id
        else:
            with pytest.raises(RegistryError, match="not reachable.*invoke registry.start"):
                push(0)
            assert _tags_for(client, target) == []
        assert "Traceback" not in out.getvalue()
    finally:
        t.join()
        stop_local(s)
        cleanup_pulled(client, s.registry.address)


def test_push_pushes_what_build_recorded(client, small, registry, tmp_path, app_dir):
    """`invoke build --variant cpu push`: push, given no --variant, pushes the cpu build (the gpu one
    recorded from another spec stays), and asking for a variant never built names the command that works."""
    s = make_settings(tmp_path / "w", app_dir)
    cpu = build_record(small, spec_hash(SPEC))
    stale_gpu = {**build_record(small, "f" * 64, "gpu")}
    _recorded(s, small)
    write_build(s.build_dir, {"cpu": cpu, "gpu": stale_gpu})
    said = io.StringIO()
    out = pipeline.push(s, str(SPEC), None, Reporter(stream=said))
    assert list(out["images"]) == ["cpu"] and list(read_pushes(s.build_dir)) == ["cpu"]
    assert "not pushing gpu: built from another spec" in said.getvalue()
    write_build(s.build_dir, {"cpu": cpu})
    with pytest.raises(ConfigError, match="build it: invoke build --variant gpu, or push what was built: "
                                          "invoke push --variant cpu"):
        pipeline.push(s, str(SPEC), "gpu", Reporter())


def test_a_layer_another_repository_has_is_mounted_not_sent(client, small, tmp_path):
    """The gpu image after the cpu one (pipeline.push passes the registry's other repositories): the
    layers they share are mounted across repositories, not uploaded again."""
    from helpers.small_image import PlainRegistry
    from toolchain.publish.push import push_image
    reg = PlainRegistry(tmp_path / "reg")
    kw = dict(layer_store=small.store, blob_cache=tmp_path / "blobs", candidates=[small.base_ref])
    try:
        first = push_image(client, "cpu", small.image_id, f"{reg.address}/raytrain-cpu", ["a"], 0, 0.1,
                           Reporter(quiet=True), 30, **kw)
        second = push_image(client, "gpu", small.image_id, f"{reg.address}/raytrain-gpu", ["a"], 0, 0.1,
                            Reporter(quiet=True), 30, mount_from=["raytrain-cpu"], **kw)
        assert (second.layers_mounted, second.layers_pushed, second.bytes_uploaded) == (2, 0, 0)
        assert second.digest == first.digest
        client.images.remove(small.image_id, force=True)
        assert client.images.pull(second.repo_digest.docker()).id == small.image_id
    finally:
        reg.stop()
        cleanup_pulled(client, reg.address)


@pytest.fixture
def push_big(client, big_image, tmp_path):
    """push_big(): the big image pushed to a registry of its own from an empty blob cache, with the
    layer store; (result, what it said, the registry's address)."""
    from helpers.small_image import PlainRegistry
    from toolchain.publish.push import push_image
    reg = PlainRegistry(tmp_path / "reg")

    def push():
        said = io.StringIO()
        res = push_image(client, "cpu", big_image.image_id, f"{reg.address}/raytrain-stream", ["a"], 0, 0.1,
                         Reporter(stream=said), 60, layer_store=big_image.store, blob_cache=tmp_path / "blobs",
                         candidates=[big_image.base_ref])
        return res, said.getvalue(), reg.address
    yield push
    reg.stop()
    cleanup_pulled(client, reg.address)


def test_a_stored_layer_is_uploaded_while_it_is_compressed(client, big_image, push_big, tmp_path):
    """From an empty blob cache, a layer in the layer store goes up as it is compressed (one PATCH stream,
    then the digest): the registry keeps exactly the cached blob's bytes, and the image pulls back whole."""
    res, said, address = push_big()
    assert said.count("pushed while compressed") == 1, said  # the store holds the one big layer
    assert res.layers_pushed == 2 and res.layers_compressed == 2
    blob = next(p for p in (tmp_path / "blobs").glob("*.gz") if p.stat().st_size > 64 << 20)
    digest = json.loads(blob.with_suffix(".json").read_text())["digest"]
    got = requests.get(f"http://{address}/v2/raytrain-stream/blobs/{digest}").content
    assert got == blob.read_bytes() and "sha256:" + hashlib.sha256(got).hexdigest() == digest
    client.images.remove(big_image.image_id, force=True)
    assert client.images.pull(res.repo_digest.docker()).id == big_image.image_id


def test_a_stored_tar_that_is_not_the_layer_is_not_pushed(client, big_image, push_big):
    """The layer store's tar changed since the build (same size, other bytes): the streamed upload is
    cancelled before its digest is given, the layer is read from the engine instead, and what the
    registry serves is the real layer."""
    tar = next(p for p in big_image.store.glob("*.tar") if p.stat().st_size > 64 << 20)
    with open(tar, "r+b") as f:
        f.seek(40 << 20)
        f.write(b"\xff" * 4096)
    res, said, _ = push_big()
    assert "reading the layer from the engine instead" in said and "pushed while compressed" not in said
    client.images.remove(big_image.image_id, force=True)
    assert client.images.pull(res.repo_digest.docker()).id == big_image.image_id


def test_a_digest_cache_entry_that_names_another_layer_s_blob_is_not_used(client, small, tmp_path, monkeypatch):
    """The shared digest index (~/.cache/raytrain/blob-digests) is data, not trust: an entry for the top
    layer that names the base layer's blob is checked against the size the registry gives for that blob
    (and against the layer's tar where the store has it), dropped, and the layer compressed and pushed;
    the manifest names the real blob and the image pulls back whole."""
    from helpers.small_image import PlainRegistry
    from toolchain import cache
    from toolchain.publish.push import push_image
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    reg = PlainRegistry(tmp_path / "reg")
    try:
        first = push_image(client, "cpu", small.image_id, f"{reg.address}/raytrain-cpu", ["a"], 0, 0.1,
                           Reporter(quiet=True), 30, layer_store=small.store, blob_cache=tmp_path / "blobs1",
                           candidates=[small.base_ref])
        index = tmp_path / "cache" / cache.BLOB_DIGESTS
        base_d, top_d = client.images.get(small.image_id).attrs["RootFS"]["Layers"]
        base, top = (json.loads((index / f"{d[7:]}.json").read_text()) for d in (base_d, top_d))
        forged = {**top, "digest": base["digest"]}  # the base's blob, under the top layer's entry
        (index / f"{top_d[7:]}.json").write_text(json.dumps(forged))
        said = io.StringIO()
        second = push_image(client, "gpu", small.image_id, f"{reg.address}/raytrain-gpu", ["a"], 0, 0.1,
                            Reporter(stream=said), 30, layer_store=small.store, blob_cache=tmp_path / "blobs2",
                            candidates=[small.base_ref], mount_from=["raytrain-cpu"])
        assert f"the digest cache's entry for layer {top_d[7:19]} names blob {base['digest'][7:19]}" in said.getvalue()
        assert second.digest == first.digest  # the same manifest: the top layer's own blob
        (index / f"{top_d[7:]}.json").write_text(json.dumps({**base, "diff_id": top_d}))  # digest and sizes copied
        said = io.StringIO()
        third = push_image(client, "gpu", small.image_id, f"{reg.address}/raytrain-other", ["a"], 0, 0.1,
                           Reporter(stream=said), 30, layer_store=small.store, blob_cache=tmp_path / "blobs3",
                           candidates=[small.base_ref], mount_from=["raytrain-cpu"])
        assert "bytes uncompressed; its tar has" in said.getvalue() and third.digest == first.digest
        client.images.remove(small.image_id, force=True)
        assert client.images.pull(third.repo_digest.docker()).id == small.image_id
    finally:
        reg.stop()
        cleanup_pulled(client, reg.address)


def test_a_fresh_runner_s_push_compresses_only_the_layers_the_registry_lacks(client, small, tmp_path, monkeypatch):
    """A runner with an empty cache (no blob cache, no digest index: a fresh CI runner) pushes an image one
    layer above the one a previous push left under the same tag: the layers that image has are paired with
    their blobs by its manifest and config (toolchain/image/previous_image.py), not compressed; the new layer is
    the only one compressed and uploaded, and the image pulls back whole."""
    import uuid
    from helpers.small_image import PlainRegistry
    from toolchain import cache
    from toolchain.image import layers
    from toolchain.publish.push import push_image
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache-before"))
    reg = PlainRegistry(tmp_path / "reg")
    target = f"{reg.address}/team/app"
    new_ref = f"raytrain-pushtest:added-{uuid.uuid4().hex[:8]}"
    try:
        push_image(client, "cpu", small.image_id, target, ["cpu-latest"], 0, 0.1, Reporter(quiet=True), 30,
                   layer_store=small.store, blob_cache=tmp_path / "blobs-before", candidates=[small.base_ref])
        lower = client.images.get(small.image_id).attrs
        added = layers.make_layer([("opt/added.txt", b"a wheel added\n", False)])
        store = tmp_path / "store-after"
        new_id = layers.load(client, [added], layers.image_config(lower, [*lower["RootFS"]["Layers"], added.diff_id]),
                             new_ref, store)
        monkeypatch.setenv(cache.ENV, str(tmp_path / "cache-fresh"))
        said = io.StringIO()
        res = push_image(client, "cpu", new_id, target, ["cpu-latest"], 0, 0.1, Reporter(stream=said), 30,
                         layer_store=store, blob_cache=tmp_path / "blobs-fresh", candidates=[small.ref, small.base_ref])
        assert (res.layers_known_from_registry, res.layers_compressed, res.layers_pushed) == (2, 1, 1), said.getvalue()
        assert res.bytes_compressed == added.size
        client.images.remove(new_ref, force=True)
        pulled = res.repo_digest.docker()
        assert client.images.pull(pulled).id == new_id
        assert client.containers.run(pulled, ["cat", "/opt/added.txt", "/opt/hello.txt"], remove=True) == (
            b"a wheel added\n" + small.text)
    finally:
        reg.stop()
        cleanup_pulled(client, reg.address)
        try:
            client.images.remove(new_ref, force=True)
        except Exception:  # noqa: BLE001 - removed above when the test got that far
            pass


def test_the_local_registry_and_the_blob_cache_store_each_blob_once(pushed, settings):
    """The registry this tool runs keeps its files beside the project: each pushed layer's cached blob
    is the registry's file (one inode), not a second copy of its bytes."""
    from toolchain.publish.push import BLOB_CACHE
    storage = Path(settings.registry.data_dir) / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    shared = 0
    for side in (settings.build_dir / BLOB_CACHE).glob("*.json"):
        digest = json.loads(side.read_text())["digest"].removeprefix("sha256:")
        mine, theirs = side.with_suffix(".gz").stat(), (storage / digest[:2] / digest / "data").stat()
        assert (mine.st_ino, mine.st_dev) == (theirs.st_ino, theirs.st_dev), side
        shared += mine.st_size
    assert shared > 1 << 30  # the example's image: gigabytes stored once

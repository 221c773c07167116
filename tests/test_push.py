"""Push to a real docker-registry: digests recorded, pull back by digest, failures leave nothing."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker
import pytest
import requests

from conftest import SPEC, make_settings, run_in
from toolchain import pipeline
from toolchain.errors import RegistryError
from toolchain.records import read_pushes
from toolchain.progress import Reporter


def test_push_records_digest_and_pull_back_by_digest(client, built, pushed, settings):
    recorded = {v: r.model_dump() for v, r in read_pushes(settings.build_dir).items()}
    for v in ("cpu", "gpu"):
        entry = recorded[v]
        assert entry["repo_digest"].startswith(f"{settings.registry.address}/raytrain-{v}@sha256:")
        assert entry["image_id"] == built[v]["image_id"] and entry["spec_sha256"] == built[v]["spec_sha256"]
        assert entry["repo_digest"] in client.images.get(built[v]["local_ref"]).attrs["RepoDigests"]
    ref = recorded["cpu"]["repo_digest"]
    # the registry itself serves the manifest under that digest
    repo, digest = ref.split("/", 1)[1].split("@")
    r = requests.head(f"http://{settings.registry.address}/v2/{repo}/manifests/{digest}",
                      headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    assert r.status_code == 200 and r.headers["Docker-Content-Digest"] == digest

    client.images.remove(built["cpu"]["image_id"], force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(built["cpu"]["local_ref"])
    pulled = client.images.pull(ref)
    assert pulled.id == built["cpu"]["image_id"]
    out = run_in(client, ref, ["python", "-m", "runtime", "selfcheck"])
    assert json.loads(out.strip().splitlines()[-1])["cluster_name"] == "local-docker"
    repo_name, tag = built["cpu"]["local_ref"].rsplit(":", 1)
    pulled.tag(repo_name, tag)  # restore for later tests


def _tags_for(client, prefix):
    return [t for img in client.images.list() for t in img.tags if t.startswith(prefix)]


def test_registry_down_is_clear_and_records_nothing(client, built, tmp_path, app_dir):
    s = make_settings(tmp_path / "w", app_dir, registry_address="127.0.0.1:5999", start_local=False)
    (s.build_dir / "build.json").write_text(json.dumps({"cpu": built["cpu"]}))
    with pytest.raises(RegistryError, match="5999.*start_local is false"):
        pipeline.push(s, str(SPEC), "cpu", Reporter())
    assert read_pushes(s.build_dir) == {}
    assert _tags_for(client, "127.0.0.1:5999/") == []


class FaultyProxy:
    """Forwards to the real registry; answers `status` to the first `failures` matching requests."""

    def __init__(self, upstream, method, status, failures, body=b""):
        self.upstream, self.count = upstream, 0
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
        self.server.shutdown()


@pytest.fixture
def proxied(client, tmp_path, app_dir, built, registry, settings):
    made = []

    def make(method, status, failures, retries, body=b""):
        proxy = FaultyProxy(settings.registry.address, method, status, failures, body)
        made.append(proxy)
        s = make_settings(tmp_path / f"w{len(made)}", app_dir, registry_address=proxy.address, retries=retries)
        (s.build_dir / "build.json").write_text(json.dumps({"cpu": built["cpu"]}))
        return s, proxy

    yield make
    for p in made:
        p.close()
        for tag in _tags_for(client, p.address + "/"):
            client.images.remove(tag, noprune=True)


def test_transient_5xx_is_retried(client, proxied):
    s, proxy = proxied("PUT", 503, failures=1, retries=2)
    out = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    assert proxy.count == 1 and out["push"]["attempts"] == 2
    assert read_pushes(s.build_dir)["cpu"].repo_digest.startswith(proxy.address)


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
    assert proxy.count == 1  # not retried
    assert read_pushes(s.build_dir) == {}

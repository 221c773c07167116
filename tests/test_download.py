"""The wheels a resolution names, fetched from the lock's URLs (toolchain/wheels/download.py), against a real
HTTP server here: each file checked against the lock's size and sha256 and renamed into the pool only then;
what the index refuses left to pip; a stream cut off, or a server's 503, tried again. And end to end: uv
resolves against a PEP 503 index served here and the wheelhouse fetches what it names with no pip."""
from __future__ import annotations

import hashlib
import os
import stat
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from toolchain.errors import WheelhouseError
from toolchain.progress import Reporter
from toolchain.wheels import download, resolver, wheelhouse
from toolchain.wheels.download import WheelFile

PY = "3.11"


class _Index(SimpleHTTPRequestHandler):
    """Files under the served directory; /flaky/ answers 503 to the first request of each file, /cut/ sends half
    of the first answer and closes; each request is logged (path, user agent)."""
    log: list
    seen: set

    def do_GET(self):  # noqa: N802 - http.server's name
        self.log.append((self.path, self.headers.get("User-Agent", "")))
        first = self.path not in self.seen
        self.seen.add(self.path)
        if self.path.startswith("/flaky/") and first:
            self.send_error(503)
            return
        if self.path.startswith("/cut/") and first:
            data = (Path(self.directory) / self.path.rsplit("/", 1)[-1]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path.startswith(("/flaky/", "/cut/")):
            self.path = "/" + self.path.rsplit("/", 1)[-1]
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    log: list = []
    handler = type("Handler", (_Index,), {"log": log, "seen": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}", log
    server.shutdown()
    server.server_close()


def _wheel(dest: Path, name: str, version: str, requires: tuple = ()) -> Path:
    """A real pure-Python wheel of one module (METADATA, WHEEL, RECORD)."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"VALUE = 1\n",
             f"{dist}/METADATA": ("Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={_b64(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(n, d)
    return path


def _b64(data: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _listed(path: Path, url: str, **over) -> WheelFile:
    data = path.read_bytes()
    return WheelFile(**{"name": path.name, "url": url, "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data), **over})


def test_wheels_are_fetched_in_parallel_and_each_checked_against_the_lock(index, tmp_path):
    served, url, log = index
    pool = tmp_path / "pool"
    pool.mkdir()
    wheels = [_wheel(served, f"pkg{i}", "1.0") for i in range(8)]
    (pool / ".pkg9-1.0-py3-none-any.whl.x1y2.part").write_bytes(b"a download killed before its rename")
    fetched, refused = download.fetch(pool, [_listed(w, f"{url}/{w.name}") for w in wheels], Reporter(quiet=True), "t")
    assert fetched == sorted(w.name for w in wheels) and refused == {}
    assert all((pool / w.name).read_bytes() == w.read_bytes() for w in wheels)
    assert sorted(p.name for p in pool.iterdir()) == fetched  # no temporary file left, the stale one removed
    # the mode any file the user writes gets (the umask's), not a temporary file's 0600: another user's
    # build (a CI runner's job user) reads a shared pool
    umask = os.umask(0o022)
    os.umask(umask)
    assert {stat.S_IMODE((pool / f).stat().st_mode) for f in fetched} == {0o666 & ~umask}
    assert all(agent.startswith("python-requests/") for _, agent in log)


def test_a_503_and_a_stream_cut_off_are_tried_again(index, tmp_path):
    served, url, log = index
    pool = tmp_path / "pool"
    pool.mkdir()
    flaky, cut = _wheel(served, "flaky", "1.0"), _wheel(served, "cut", "1.0")
    fetched, refused = download.fetch(pool, [_listed(flaky, f"{url}/flaky/{flaky.name}"),
                                             _listed(cut, f"{url}/cut/{cut.name}")], Reporter(quiet=True), "t")
    assert fetched == sorted([flaky.name, cut.name]) and refused == {}
    assert (pool / cut.name).read_bytes() == cut.read_bytes()
    assert [p for p, _ in log].count(f"/cut/{cut.name}") == 2 and [p for p, _ in log].count(f"/flaky/{flaky.name}") == 2


def test_bytes_that_are_not_the_lock_s_are_one_line_and_nothing_is_kept(index, tmp_path):
    served, url, _ = index
    pool = tmp_path / "pool"
    pool.mkdir()
    good, other = _wheel(served, "good", "1.0"), _wheel(served, "other", "1.0")
    wrong_hash = _listed(good, f"{url}/{good.name}", sha256="0" * 64)
    with pytest.raises(WheelhouseError, match=rf"{good.name} from .*: its sha256 is [0-9a-f]{{64}}, where the lock says "
                                              r"0{64}; nothing was kept") as e:
        download.fetch(pool, [wrong_hash, _listed(other, f"{url}/{other.name}")], Reporter(quiet=True), "t")
    assert "\n" not in str(e.value)
    assert not (pool / good.name).exists() and not list(pool.glob(".*.part"))
    with pytest.raises(WheelhouseError, match=rf"{good.name} from .*: \d+ bytes, where the lock says 7;"):
        download.fetch(pool, [_listed(good, f"{url}/{good.name}", size=7)], Reporter(quiet=True), "t")
    assert not (pool / good.name).exists() and not list(pool.glob(".*.part"))


def test_a_file_the_index_refuses_is_left_to_pip(index, tmp_path):
    served, url, _ = index
    pool = tmp_path / "pool"
    pool.mkdir()
    fine = _wheel(served, "fine", "1.0")
    absent = WheelFile("absent-1.0-py3-none-any.whl", f"{url}/absent-1.0-py3-none-any.whl", "1" * 64, 10)
    fetched, refused = download.fetch(pool, [_listed(fine, f"{url}/{fine.name}"), absent], Reporter(quiet=True), "t")
    assert fetched == [fine.name] and refused == {absent.name: "HTTP 404"}
    assert sorted(p.name for p in pool.iterdir()) == [fine.name]


def _simple_index(served: Path, wheels: list[Path]) -> None:
    """A PEP 503 index of WHEELS under served/simple/, each link with its sha256."""
    by_project: dict = {}
    for w in wheels:
        by_project.setdefault(w.name.split("-")[0], []).append(w)
    (served / "simple").mkdir()
    for project, files in by_project.items():
        (served / "simple" / project).mkdir()
        links = "".join(f'<a href="../../{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                        for w in files)
        (served / "simple" / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def test_uv_s_lock_names_the_wheels_and_the_wheelhouse_fetches_them_without_pip(index, tmp_path, monkeypatch):
    served, url, log = index
    wheels = [_wheel(served, "top", "2.0", requires=("leaf>=1",)), _wheel(served, "leaf", "1.5"),
              _wheel(served, "leaf", "1.0")]
    _simple_index(served, wheels)
    monkeypatch.setenv("RAYTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", f"{url}/simple")
    monkeypatch.delenv("UV_EXCLUDE_NEWER", raising=False)  # (conftest's) this index gives no upload times
    pins = {p.name: p for p in resolver.resolve(["top==2.0"], PY, tmp_path / "no-pool")}
    assert {n: str(p.version) for n, p in pins.items()} == {"top": "2.0", "leaf": "1.5"}
    (leaf,) = pins["leaf"].wheels
    # an HTML index gives no sizes (PyPI's JSON one does): the sha256 alone is checked
    assert (leaf.name, leaf.url, leaf.size) == ("leaf-1.5-py3-none-any.whl", f"{url}/leaf-1.5-py3-none-any.whl", None)
    assert leaf.sha256 == hashlib.sha256(wheels[1].read_bytes()).hexdigest()

    pool = tmp_path / "pool"
    pool.mkdir()
    del log[:]
    got = wheelhouse.set_files(pool, ["top==2.0"], PY, "cpu", None, {}, Reporter(quiet=True))
    files = got.files
    assert files == got.fetched == ["leaf-1.5-py3-none-any.whl", "top-2.0-py3-none-any.whl"]
    assert sorted(got.lock) == files
    # each checked as it arrived: the registry build takes these digests and does not read the files again
    assert got.checked == {f: hashlib.sha256((pool / f).read_bytes()).hexdigest() for f in files}
    got = [(p, agent) for p, agent in log if p.endswith(".whl")]
    assert sorted(p for p, _ in got) == ["/leaf-1.5-py3-none-any.whl", "/top-2.0-py3-none-any.whl"]
    assert not any(agent.startswith("pip/") for _, agent in log), log  # pip did not run
    assert all((pool / f).read_bytes() == (served / f).read_bytes() for f in files)


def test_the_lock_s_wheels_are_those_the_image_takes_most_specific_first():
    sha = "a" * 64

    def wheel(url, **kw):
        return {"url": url, "hashes": {"sha256": sha}, "size": 1, **kw}
    doc = {"packages": [{"name": "Foo_Bar", "version": "1.0", "wheels": [
        wheel("https://x/foo_bar-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
        wheel("https://x/foo_bar-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        wheel("https://x/foo_bar-1.0-cp311-cp311-manylinux_2_39_x86_64.whl"),   # a newer glibc than the base's
        wheel("https://x/foo_bar-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"),   # another Python
        wheel("https://x/foo_bar-1.1-cp311-cp311-manylinux_2_28_x86_64.whl"),   # another release
        wheel("file:///pool/foo_bar-1.0-py3-none-any.whl"),                      # the pool's
        wheel("https://x/..%2F..%2Fetc%2Ffoo_bar-1.0-py3-none-any.whl"),         # a name that is a path
        {"url": "https://x/foo_bar-1.0-py3-none-any.whl", "hashes": {"md5": "0" * 32}},  # no sha256
    ]}, {"name": "only-sdist", "version": "2.0", "sdist": {"url": "https://x/only_sdist-2.0.tar.gz"}}]}
    foo, sdist = resolver.parse_lock(doc, PY)
    assert (foo.name, str(foo.version)) == ("foo-bar", "1.0") and sdist.wheels == ()
    assert [w.url.rsplit("/", 1)[1] for w in foo.wheels] == [
        "foo_bar-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "foo_bar-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]


@pytest.mark.parametrize("doc,says", [
    ({}, "no \\[\\[packages\\]\\]"),
    ({"packages": [{"name": "numpy"}]}, "without a name and a version"),
    ({"packages": [{"name": "numpy", "version": "2.0"}, {"name": "numpy", "version": "2.1"}]}, "names numpy twice"),
    ({"packages": [{"name": "numpy", "version": "not-a-version"}]}, "not one"),
    ({"packages": []}, "empty"),
])
def test_a_resolution_that_is_not_a_lock_of_pins_is_refused(doc, says):
    with pytest.raises(resolver.ResolveError, match=says):
        resolver.parse_lock(doc, PY)

"""The wheelhouse: the user's wheel pool and its requirement sets (toolchain/wheels/wheelhouse.py).

One process fills a set at a time; a set is reused by any project with the same requirements without
pip; a new set downloads only the wheels the pool lacks; a lock's hashes are honoured; the pool is
bounded. The pip tests download small real wheels from PyPI (the suite's images download all of them)."""
import hashlib
import io
import json
import os
import threading
import time

import pytest

from conftest import ROOT, make_settings
from toolchain import cache
from toolchain.wheels import pool_page, wheelhouse
from toolchain.config import TorchSettings
from toolchain.errors import ConfigError
from toolchain.progress import Reporter


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_two_builds_of_the_same_requirements_fill_the_wheelhouse_once(tmp_path, own_cache, monkeypatch, capsys):
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train", runtime_dir=ROOT / "runtime")
    monkeypatch.setattr(wheelhouse, "choose_torch", lambda *a: ("torch==2.9.1", "default index"))
    fills = []

    def slow_fill(path, pool, wanted, *rest):  # what pip download takes, shortened; the manifest last, as _fill does
        fills.append(path)
        partial = path.with_name(path.name + ".partial")
        partial.mkdir()
        time.sleep(0.5)
        (pool / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
        digest = hashlib.sha256(b"wheel").hexdigest()
        full = [r.text for r in wanted]
        (partial / wheelhouse.MANIFEST).write_text(json.dumps({"key": "0" * 16, "requirements": full,
                                                               "wheels": ["x-1.0-py3-none-any.whl"], "size": 5,
                                                               "sha256": [digest]}))
        (partial / wheelhouse.LOCK).write_text(wheelhouse._lock_text(["x-1.0-py3-none-any.whl"], [digest]))
        partial.rename(path)
        return wheelhouse.Wheelhouse(path, "0" * 16, full, ["x-1.0-py3-none-any.whl"], 5, "default index", (digest,),
                                     pool)

    monkeypatch.setattr(wheelhouse, "_fill", slow_fill)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        wheelhouse.ensure_wheelhouse(s, "cpu", "3.11", Reporter()))) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=30)
    assert len(fills) == 1 and len(results) == 2 and results[0].path == results[1].path == fills[0]
    assert fills[0].parent == own_cache / cache.WHEEL_SETS
    err = capsys.readouterr().err
    assert "another build is downloading the same wheels; waiting for it" in err and "reusing" in err


def test_the_wheelhouses_own_files_are_data_not_trust(tmp_path, own_cache, monkeypatch):
    """A damaged, wrongly typed or linked manifest is a set to fill again, not a traceback; a torch memo
    naming anything but the two known choices (here an index option) is not followed."""
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    wh, pool = tmp_path / "set", tmp_path / "pool"
    wh.mkdir()
    pool.mkdir()
    for text in ['{"key": "0000000000000000", "wheels"', '{"key": 1, "requirements": [], "wheels": [], "size": 0}',
                 '[]', '{"key": "0000000000000000", "requirements": [], "wheels": ["../../etc/passwd"], "size": 0, '
                 '"sha256": ["' + "0" * 64 + '"]}']:
        (wh / wheelhouse.MANIFEST).write_text(text)
        assert wheelhouse._reuse(wh, pool, "cpu", "default index", Reporter()) is None
    (wh / wheelhouse.MANIFEST).unlink()
    os.symlink("/etc/passwd", wh / wheelhouse.MANIFEST)
    assert wheelhouse._reuse(wh, pool, "cpu", "default index", Reporter()) is None

    torch = s.image.torch["cpu"]
    assert torch.index_url  # the cpu variant's torch comes from its own index: the memo is written
    from toolchain.hashing import key_of
    memo = own_cache / cache.WHEEL_SETS / f"torch-{key_of('3.11', torch.model_dump())[:16]}.json"
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({"requirement": "--index-url=http://evil.example/simple", "source": "x"}))
    asked = []
    monkeypatch.setattr(wheelhouse, "_pip_download", lambda d, reqs, py, extra: asked.append(reqs) or
                        type("R", (), {"returncode": 1, "stderr": "no", "stdout": ""})())
    req, source = wheelhouse.choose_torch(s, "cpu", "3.11", Reporter())
    assert asked and "--index-url" not in " ".join(asked[0]) and req == torch.requirement
    assert json.loads(memo.read_text())["requirement"] == torch.requirement  # written again, from the settings
    # cut short, a list, its key missing: each is said, and the choice made again
    for text in ('{"requirement": "torch', "[]", '{"source": "default index (fallback)"}'):
        memo.write_text(text)
        err = io.StringIO()
        wheelhouse.choose_torch(s, "cpu", "3.11", Reporter(stream=err))
        assert f"{memo} is not a torch choice this tool wrote" in err.getvalue(), text
        assert json.loads(memo.read_text())["requirement"] == torch.requirement


def _tiny_project(tmp_path, name: str, lines: list[str]):
    """A project whose runtime needs only `six` and whose 'torch' is `idna` (small real wheels from PyPI)."""
    runtime = tmp_path / f"{name}-runtime"
    runtime.mkdir()
    (runtime / "requirements.txt").write_text("six==1.17.0\n")
    app = tmp_path / f"{name}-app"
    app.mkdir()
    (app / "requirements.txt").write_text("".join(f"{line}\n" for line in lines))
    s = make_settings(tmp_path / name, app, runtime_dir=runtime)
    image = s.image.model_copy(update={"torch": {"cpu": TorchSettings(requirement="idna==3.10")}})
    return s.model_copy(update={"image": image})


def _counting_downloads(monkeypatch) -> list:
    """Each download's files or requirements: from the lock's URLs (toolchain/wheels/download.py) or by pip."""
    calls = []
    real_pip, real_fetch = wheelhouse._pip_download, wheelhouse.download.fetch

    def pip(dest, reqs, py, extra):
        calls.append(list(reqs))
        return real_pip(dest, reqs, py, extra)

    def fetch(pool, wheels, rep, what):
        if wheels:
            calls.append([w.name for w in wheels])
        return real_fetch(pool, wheels, rep, what)
    monkeypatch.setattr(wheelhouse, "_pip_download", pip)
    monkeypatch.setattr(wheelhouse.download, "fetch", fetch)
    return calls


def test_two_projects_share_the_pool_and_a_set_is_resolved_once(tmp_path, own_cache, monkeypatch, capsys):
    calls = _counting_downloads(monkeypatch)
    first = wheelhouse.ensure_wheelhouse(_tiny_project(tmp_path, "p1", ["tabulate==0.9.0"]), "cpu", "3.11", Reporter())
    assert sorted(w.split("-")[0] for w in first.wheels) == ["idna", "six", "tabulate"] and len(calls) == 1
    assert all(f.parent == own_cache / cache.WHEELS and f.is_file() for f in first.files)
    lock = (first.path / wheelhouse.LOCK).read_text()
    assert all(f"--hash=sha256:{d}" in lock for d in first.sha256)

    # the same requirements in another project: the same set, no download at all (no network)
    again = wheelhouse.ensure_wheelhouse(_tiny_project(tmp_path, "p2", ["tabulate==0.9.0"]), "cpu", "3.11", Reporter())
    assert again.path == first.path and len(calls) == 1

    # one more wheel: a new set, one download, of that wheel alone
    capsys.readouterr()
    more = wheelhouse.ensure_wheelhouse(_tiny_project(tmp_path, "p3", ["tabulate==0.9.0", "toml==0.10.2"]), "cpu",
                                        "3.11", Reporter())
    assert more.path != first.path and len(calls) == 2 and calls[1] == ["toml-0.10.2-py2.py3-none-any.whl"]
    assert "1 downloaded" in capsys.readouterr().err
    assert sorted(os.listdir(own_cache / cache.WHEELS)) == sorted({*first.wheels, *more.wheels, ".lock", ".used",
                                                                    pool_page.HASHES})

    # a wheel pruned from the pool: the set is filled again, that wheel alone downloaded
    (own_cache / cache.WHEELS / next(w for w in first.wheels if w.startswith("tabulate"))).unlink()
    capsys.readouterr()
    wheelhouse.ensure_wheelhouse(_tiny_project(tmp_path, "p4", ["tabulate==0.9.0"]), "cpu", "3.11", Reporter())
    assert len(calls) == 3 and "1 downloaded" in capsys.readouterr().err


def test_a_reused_set_is_checked_against_its_lock_and_its_wheels_bytes(tmp_path, own_cache, monkeypatch, capsys):
    """A wheel whose bytes changed in the pool (same size, same mtime) is found by its sha256 and fetched again;
    a lock that no longer lists the manifest's wheels makes the set again. A wheel whose stat is unchanged
    since it was found good is not hashed again."""
    calls = _counting_downloads(monkeypatch)
    project = _tiny_project(tmp_path, "p1", ["tabulate==0.9.0"])
    first = wheelhouse.ensure_wheelhouse(project, "cpu", "3.11", Reporter())
    assert len(calls) == 1
    hashed = []
    real_sha = wheelhouse.file_sha256
    monkeypatch.setattr(wheelhouse, "file_sha256", lambda p: hashed.append(p.name) or real_sha(p))
    wheelhouse.ensure_wheelhouse(project, "cpu", "3.11", Reporter())
    assert len(calls) == 1 and hashed == []  # reused, nothing hashed: every wheel's stat is as it was found good

    tab = own_cache / cache.WHEELS / next(w for w in first.wheels if w.startswith("tabulate"))
    st = tab.stat()
    data = bytearray(tab.read_bytes())
    data[100] ^= 0xFF
    tab.write_bytes(bytes(data))
    os.utime(tab, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same size and mtime: only the bytes (and ctime) differ
    capsys.readouterr()
    again = wheelhouse.ensure_wheelhouse(project, "cpu", "3.11", Reporter())
    assert f"{tab} is not the wheel its set recorded" in capsys.readouterr().err
    assert len(calls) == 2 and hashed[0] == tab.name  # the changed wheel alone was hashed to find it, then refetched
    assert hashlib.sha256(tab.read_bytes()).hexdigest() == again.sha256[again.wheels.index(tab.name)]

    lock = again.path / wheelhouse.LOCK
    lock.write_text(lock.read_text().replace("tabulate==0.9.0", "tabulate==0.8.0"))
    capsys.readouterr()
    wheelhouse.ensure_wheelhouse(project, "cpu", "3.11", Reporter())
    assert "does not list the wheels its manifest does; the set is made again" in capsys.readouterr().err
    assert "tabulate==0.9.0" in lock.read_text()  # made again from the pool: every wheel there, no download


def test_a_lock_s_hashes_are_honoured(tmp_path, own_cache):
    right = _tiny_project(tmp_path, "ok", ["tabulate==0.9.0"])
    good = wheelhouse.ensure_wheelhouse(right, "cpu", "3.11", Reporter())
    sha = dict(zip(good.wheels, good.sha256))[next(w for w in good.wheels if w.startswith("tabulate"))]
    hashed = _tiny_project(tmp_path, "hashed", [f"tabulate==0.9.0 \\\n    --hash=sha256:{sha}"])
    assert wheelhouse.ensure_wheelhouse(hashed, "cpu", "3.11", Reporter()).wheels == good.wheels
    wrong = _tiny_project(tmp_path, "wrong", ["tabulate==0.9.0 --hash=sha256:" + "0" * 64])
    with pytest.raises(ConfigError, match=r"requirements.txt:1: the lock allows 1 hash\(es\) for tabulate==0.9.0, "
                                          r"and the downloaded tabulate-0.9.0-.*\.whl .* is none of them"):
        wheelhouse.ensure_wheelhouse(wrong, "cpu", "3.11", Reporter())


def test_the_pool_is_bounded_and_keeps_the_set_in_use(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    for i, name in enumerate(["a-1-py3-none-any.whl", "b-1-py3-none-any.whl", "c-1-py3-none-any.whl",
                              "d-1-py3-none-any.whl"]):
        (pool / name).write_bytes(b"x" * 1000)
        os.utime(pool / name, (1000 + i, 1000 + i))  # a used longest ago, d last
    wheelhouse.prune_pool(pool, 2500, {"a-1-py3-none-any.whl"}, Reporter(quiet=True))
    # b and c go (the oldest not in use) until 2,000 bytes are left; a is in use, d the newest
    assert sorted(os.listdir(pool)) == ["a-1-py3-none-any.whl", "d-1-py3-none-any.whl"]
    wheelhouse.prune_pool(pool, 2500, set(), Reporter(quiet=True))  # under the bound: nothing goes
    assert len(os.listdir(pool)) == 2
    # a use is marked beside the wheel, which keeps its own stat: d used longest ago now, so d goes first
    wheelhouse._touch(pool, ["a-1-py3-none-any.whl"])
    assert os.stat(pool / "a-1-py3-none-any.whl").st_mtime == 1000
    wheelhouse.prune_pool(pool, 1500, set(), Reporter(quiet=True))
    assert sorted(n for n in os.listdir(pool) if n.endswith(".whl")) == ["a-1-py3-none-any.whl"]


def test_an_unwritable_cache_is_one_line_naming_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cache.ENV, str(blocker))
    with pytest.raises(ConfigError, match=rf"the cache directory {blocker}/wheels is not writable .*RAYTRAIN_CACHE"):
        cache.writable(cache.WHEELS)

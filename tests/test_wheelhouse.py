"""The wheelhouse is filled by one process at a time: a second build of the same requirements (or a
test run beside a build) waits and then reuses it, instead of emptying the first one's downloads."""
import hashlib
import json
import threading
import time

from conftest import ROOT, make_settings
from toolchain import wheelhouse
from toolchain.progress import Reporter


def test_two_builds_of_the_same_requirements_fill_the_wheelhouse_once(tmp_path, monkeypatch, capsys):
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    (s.build_dir / "wheelhouse").unlink()  # its own, not the shared cache
    (s.build_dir / "wheelhouse").mkdir()
    monkeypatch.setattr(wheelhouse, "choose_torch", lambda *a: ("torch==2.9.1", "default index"))
    fills = []

    def slow_fill(path, full, *rest):  # what pip download takes, shortened; the manifest last, as _fill does
        fills.append(path)
        partial = path.with_name(path.name + ".partial")
        partial.mkdir()
        time.sleep(0.5)
        (partial / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
        digest = hashlib.sha256(b"wheel").hexdigest()
        (partial / wheelhouse.MANIFEST).write_text(json.dumps({"key": "0" * 16, "requirements": full,
                                                               "wheels": ["x-1.0-py3-none-any.whl"], "size": 5,
                                                               "sha256": [digest]}))
        partial.rename(path)
        return wheelhouse.Wheelhouse(path, "0" * 16, full, ["x-1.0-py3-none-any.whl"], 5, "default index", (digest,))

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
    err = capsys.readouterr().err
    assert "another build is downloading the same wheels; waiting for it" in err and "reusing" in err


def test_the_wheelhouses_own_files_are_data_not_trust(tmp_path, monkeypatch):
    """A damaged, wrongly typed or linked manifest is a set to fill again, not a traceback; a torch memo
    naming anything but the two known choices (here an index option) is not followed."""
    import os
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    (s.build_dir / "wheelhouse").unlink()  # its own, not the shared cache: this test writes a hostile memo
    (s.build_dir / "wheelhouse").mkdir()
    wh = tmp_path / "set"
    wh.mkdir()
    for text in ['{"key": "0000000000000000", "wheels"', '{"key": 1, "requirements": [], "wheels": [], "size": 0}',
                 '[]', '{"key": "0000000000000000", "requirements": [], "wheels": ["../../etc/passwd"], "size": 0, '
                 '"sha256": ["' + "0" * 64 + '"]}']:
        (wh / wheelhouse.MANIFEST).write_text(text)
        assert wheelhouse._reuse(wh, "cpu", "default index", Reporter()) is None
    (wh / wheelhouse.MANIFEST).unlink()
    os.symlink("/etc/passwd", wh / wheelhouse.MANIFEST)
    assert wheelhouse._reuse(wh, "cpu", "default index", Reporter()) is None

    torch = s.image.torch["cpu"]
    if not torch.index_url:
        return
    from toolchain.hashing import key_of
    memo = s.build_dir / "wheelhouse" / f"torch-{key_of('3.11', torch.model_dump())[:16]}.json"
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({"requirement": "--index-url=http://evil.example/simple", "source": "x"}))
    asked = []
    monkeypatch.setattr(wheelhouse, "_pip_download", lambda d, reqs, py, extra: asked.append(reqs) or
                        type("R", (), {"returncode": 1, "stderr": "no", "stdout": ""})())
    req, source = wheelhouse.choose_torch(s, "cpu", "3.11", Reporter())
    assert asked and "--index-url" not in " ".join(asked[0]) and req == torch.requirement
    assert json.loads(memo.read_text())["requirement"] == torch.requirement  # written again, from the settings

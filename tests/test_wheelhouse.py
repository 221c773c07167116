"""The wheelhouse is filled by one process at a time: a second build of the same requirements (or a
test run beside a build) waits and then reuses it, instead of emptying the first one's downloads."""
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
        (partial / wheelhouse.MANIFEST).write_text(json.dumps({"key": "k", "requirements": full, "wheels": [],
                                                               "size": 0}))
        partial.rename(path)
        return wheelhouse.Wheelhouse(path, "k", full, [], 0, "default index")

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

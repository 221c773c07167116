"""The user cache is read as untrusted (toolchain/cache.py read_entry, toolchain/image/venv_plan.py LayerIndex): an entry
that is not what the toolchain wrote is dropped with a warning, and the layer is written again; nothing in it
names a path outside its store, a console script the venv must not have, or a file that hangs the read."""
import json
import os
import threading
import time

import pytest

from toolchain import cache
from toolchain.image.venv_plan import LayerIndex

GOOD = {"diff_id": "sha256:" + "ab" * 32, "size": 1234, "scripts": [["ray", "#!/opt/venv/bin/python\n"]]}
KEY = "0" * 64


def put_raw(index: LayerIndex, value) -> None:
    index.dir.mkdir(parents=True, exist_ok=True)
    (index.dir / f"{KEY}.json").write_text(value if isinstance(value, str) else json.dumps(value))


def test_a_good_entry_is_read_back_as_written(tmp_path):
    index = LayerIndex(tmp_path / "index")
    index.put(KEY, GOOD["diff_id"], GOOD["size"], [("ray", b"#!/opt/venv/bin/python\n")])
    assert index.get(KEY, on_bad=pytest.fail) == GOOD
    assert index.get("1" * 64, on_bad=pytest.fail) is None  # none: nothing to say


@pytest.mark.parametrize("entry,says", [
    ({**GOOD, "diff_id": "sha256:" + "../" * 21 + "x"}, "is not a sha256 digest"),  # 71 characters, as a digest
    ({**GOOD, "diff_id": "sha256:" + "AB" * 32}, "is not a sha256 digest"),
    ({**GOOD, "size": -1}, "is not a layer's size"),
    ({**GOOD, "size": True}, "is not a layer's size"),
    ({**GOOD, "scripts": [["../../../etc/cron.d/x", "* * * * * root id\n"]]}, "is not one a wheel may install"),
    ({**GOOD, "scripts": [["python3", "#!/bin/sh\n"]]}, "is not one a wheel may install"),
    ({**GOOD, "scripts": [["ok", 1]]}, "is not [name, text]"),
    ({**GOOD, "extra": 1}, "not an object of diff_id, size and scripts"),
    ([GOOD], "not an object"),
    ("{" * 100_000, "damaged"),
    ("not json", "damaged"),
])
def test_an_entry_that_is_not_what_put_writes_is_dropped_saying_why(tmp_path, entry, says):
    index = LayerIndex(tmp_path / "index")
    put_raw(index, entry)
    said = []
    assert index.get(KEY, on_bad=said.append) is None
    assert len(said) == 1 and says in said[0] and "written again" in said[0], said


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link to a good entry", "directory", "too big"])
def test_an_entry_that_is_not_a_small_regular_file_is_dropped_at_once(tmp_path, kind):
    index = LayerIndex(tmp_path / "index")
    index.dir.mkdir(parents=True)
    path = index.dir / f"{KEY}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "link to a good entry":
        (tmp_path / "elsewhere.json").write_text(json.dumps(GOOD))
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b" " * (5 << 20))
    said: list = []
    result: list = []
    t = threading.Thread(target=lambda: result.append(index.get(KEY, on_bad=said.append)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{kind}: the read hung"
    assert result == [None] and len(said) == 1, (kind, said)
    assert time.monotonic() - t0 < 5


def test_read_entry_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(cache.BadEntry, match="not a regular file"):
        cache.read_entry(tmp_path / "fifo")
    assert cache.read_entry(tmp_path / "absent") is None


def test_blob_homes_keep_only_registry_and_repository_pairs(tmp_path):
    """A home that is not a registry address and a repository (a path that climbs into the registry's API, a
    query, a tag) is never asked about, and an entry holds at most MAX homes."""
    from toolchain.publish.blobs import BlobHomes
    homes = BlobHomes(tmp_path / "homes")
    digest = "sha256:" + "cd" * 32
    homes.root.mkdir()
    hostile = [["127.0.0.1:5000", "../../../v2/_catalog?n=1#"], ["127.0.0.1:5000", "team/app:tag"],
               ["http://127.0.0.1:5000", "team/app"], ["127.0.0.1:5000/x", "app"], ["127.0.0.1:5000", "Team/App"]]
    good = [["127.0.0.1:5000", f"team/app{i}"] for i in range(20)]
    entry = homes.root / f"{digest[7:]}.json"
    entry.write_text(json.dumps(hostile + good))
    assert homes.of(digest) == [tuple(h) for h in good[-BlobHomes.MAX:]]
    entry.write_text(json.dumps(good[-1:] + hostile))
    assert homes.of(digest) == [tuple(good[-1])]
    entry.write_text(json.dumps([["127.0.0.1:5000", f"team/app{i}"] for i in range(2000)]))  # no push writes that
    assert homes.of(digest) == []
    assert homes.of("sha256:../../x") == []
    os.unlink(homes.root / f"{digest[7:]}.json")
    os.mkfifo(homes.root / f"{digest[7:]}.json")
    assert homes.of(digest) == []  # at once, not waiting on the pipe

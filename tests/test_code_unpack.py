"""The code tar a held cluster's run brings on stdin (runtime/cluster/code_unpack.py), as an attacker or a
careless tool would send it: links, traversal, bombs, truncation, duplicates. Each case goes through
the real `python -m runtime run --unpack-stdin` (exit 2, one line) or the function itself, and
nothing may be written outside the root, nor left behind on failure."""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from runtime.cluster import code_unpack
from runtime.errors import InputError
from scripts.probe_inputs import tar_of  # the probe's hostile tars and these tests', made one way

ROOT = Path(__file__).resolve().parent.parent
REL = "raytrain-code/abc"


def good() -> bytes:
    return tar_of((REL, tarfile.DIRTYPE, None), (f"{REL}/train.py", tarfile.REGTYPE, b"print('hi')\n"),
                  (f"{REL}/pkg/run.sh", tarfile.REGTYPE, b"#!/bin/sh\n", 0o4777))


def everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def cli(root: Path, data: bytes, code_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(root.parent)}
    return subprocess.run([sys.executable, "-m", "runtime", "run", "--code-dir", str(code_dir or root / REL),
                           "--unpack-stdin", str(root), "--", "true"], input=data, capture_output=True, env=env,
                          timeout=120)


def test_a_good_tar_is_unpacked_once_with_normalised_modes(tmp_path):
    root = tmp_path / "root"
    code_unpack.unpack(root, root / REL, io.BytesIO(good()))
    assert (root / REL / "train.py").read_text() == "print('hi')\n"
    mode = stat.S_IMODE((root / REL / "pkg" / "run.sh").stat().st_mode)
    assert mode & 0o7000 == 0 and mode & 0o022 == 0 and mode & 0o100  # no setuid, not world-writable, still runs
    assert stat.S_IMODE((root / REL).stat().st_mode) & 0o022 == 0
    assert (root / REL / "train.py").stat().st_uid == os.getuid()
    code_unpack.unpack(root, root / REL, io.BytesIO(b"not read: this version is there already"))
    assert everything_under(root) == ["raytrain-code", REL, f"{REL}/pkg", f"{REL}/pkg/run.sh", f"{REL}/train.py"]


def cut_at_member_boundary() -> bytes:
    data = good()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
    last = members[-1]
    return data[:last.offset]  # a valid tar of the first members, without its end-of-archive blocks


BAD = {
    "symlink chain out of the root": (tar_of((f"{REL}/a", tarfile.SYMTYPE, "."), (f"{REL}/a/b", tarfile.SYMTYPE, ".."),
                                             (f"{REL}/a/b/c", tarfile.SYMTYPE, "/etc")), "is a symlink"),
    "symlink inside": (tar_of((f"{REL}/in", tarfile.SYMTYPE, "train.py")), "is a symlink"),
    "hard link to a file outside": (tar_of((f"{REL}/h", tarfile.LNKTYPE, "/etc/passwd")), "is a hard link"),
    "absolute name": (tar_of(("/tmp/evil", tarfile.REGTYPE, b"x")), "is absolute, empty or climbs"),
    "climbs with ..": (tar_of((f"{REL}/../../evil", tarfile.REGTYPE, b"x")), "is absolute, empty or climbs"),
    "outside the run's directory": (tar_of(("raytrain-code/other/x.py", tarfile.REGTYPE, b"x")), "lies outside"),
    "a FIFO": (tar_of((f"{REL}/p", tarfile.FIFOTYPE, None)), "a device, FIFO"),
    "a device": (tar_of((f"{REL}/d", tarfile.CHRTYPE, None)), "a device, FIFO"),
    "a name twice": (tar_of((f"{REL}/x", tarfile.REGTYPE, b"1"), (f"{REL}/x", tarfile.REGTYPE, b"2")), "twice"),
    "a file then a directory": (tar_of((f"{REL}/x", tarfile.REGTYPE, b"1"), (f"{REL}/x", tarfile.DIRTYPE, None)),
                                "twice"),
    "a directory's file then the directory as a file": (
        tar_of((f"{REL}/x/y", tarfile.REGTYPE, b"1"), (f"{REL}/x", tarfile.REGTYPE, b"2")), "twice"),
    "a name too long": (tar_of((f"{REL}/{'n' * 300}", tarfile.REGTYPE, b"1")), "could not be unpacked"),
    "cut inside a member": (good()[:-(10240 - 1024)][:1500], "cut short"),
    "cut at a member boundary": (cut_at_member_boundary(), "cut short"),
    "not a tar": (b"junk" * 100, "not a tar archive"),
    "a tree deeper than 64": (tar_of((f"{REL}/" + "d/" * 65 + "x.py", tarfile.REGTYPE, b"1")), "directories deep"),
    "nothing under the directory": (tar_of(("raytrain-code", tarfile.DIRTYPE, None)), "holds nothing under"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_tar_is_refused_by_the_real_cli_and_writes_nothing(tmp_path, case):
    data, message = BAD[case]
    root = tmp_path / "root"
    root.mkdir()
    r = cli(root, data)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr.decode(), r.stderr
    assert len(r.stderr.decode().strip().splitlines()) == 1, r.stderr  # one line, no traceback
    assert everything_under(root) == []  # no code directory, no scratch, no parent left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]  # nothing beside or above the root


def test_too_many_members_and_too_many_bytes_are_refused(tmp_path, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setattr(code_unpack, "MAX_MEMBERS", 3)
    many = tar_of(*[(f"{REL}/f{i}", tarfile.REGTYPE, b"x") for i in range(4)])
    with pytest.raises(InputError, match="over 3 members"):
        code_unpack.unpack(root, root / REL, io.BytesIO(many))
    monkeypatch.setattr(code_unpack, "MAX_MEMBERS", 50_000)
    monkeypatch.setattr(code_unpack, "MAX_BYTES", 1000)
    big = tar_of((f"{REL}/a", tarfile.REGTYPE, b"x" * 600), (f"{REL}/b", tarfile.REGTYPE, b"x" * 600))
    with pytest.raises(InputError, match="contents are over"):
        code_unpack.unpack(root, root / REL, io.BytesIO(big))
    assert everything_under(tmp_path) == []


def test_a_sparse_member_is_refused(tmp_path):
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.seek(1 << 20)
        f.write(b"x")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tf.gettarinfo(str(sparse), arcname=f"{REL}/s")
        info.type = tarfile.GNUTYPE_SPARSE
        tf.addfile(info)
    root = tmp_path / "root"
    with pytest.raises(InputError):
        code_unpack.unpack(root, root / REL, io.BytesIO(buf.getvalue()))
    assert not root.exists()


def test_the_unpack_root_and_code_dir_must_be_directories(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    r = cli(afile, good(), code_dir=afile / REL)
    assert r.returncode == 2 and "not a directory" in r.stderr.decode(), r.stderr
    root = tmp_path / "root"
    (root / "raytrain-code").mkdir(parents=True)
    (root / REL).symlink_to("/etc")
    r = cli(root, good())
    assert r.returncode == 2 and "something other than a directory is there" in r.stderr.decode(), r.stderr
    r = cli(root, good(), code_dir=tmp_path / "elsewhere")
    assert r.returncode == 2 and "must lie below" in r.stderr.decode(), r.stderr


def test_a_sender_that_keeps_the_stream_open_is_not_waited_for(tmp_path):
    """After a whole tar the stream may stay open (a tool that does not close its stdin): the unpack stops
    at the end-of-archive blocks and the run goes on; a sender that stops sending is timed out, named."""
    root = tmp_path / "root"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "run", "--code-dir", str(root / REL), "--unpack-stdin",
                             str(root), "--", "true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(good())
        proc.stdin.flush()  # and not closed
        proc.wait(timeout=60)  # it went on past the unpack (here to ask for a serving cluster, which there is not)
        assert b"no cluster is serving" in proc.stderr.read()
        assert (root / REL / "train.py").read_text() == "print('hi')\n"
    finally:
        proc.kill()
        proc.stdin.close()
    r, w = os.pipe()
    try:
        os.write(w, good()[:1024])  # a header and a part of its member, then nothing
        with open(r, "rb", buffering=0) as stream, pytest.raises(InputError, match="stalled: no byte came for 1 s"):
            code_unpack.read_tar(stream, stall_s=1)
    finally:
        os.close(w)

"""Hostile and broken wheels (toolchain/wheels/wheel_checks.py, toolchain/image/venv_layer.py): each is refused with one
line naming the wheel's file, before a layer is written, and leaves no layer behind. Engine-free."""
from __future__ import annotations

import os
import struct
import warnings
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.test_venv_layer import PY, SITE, make_wheel, members, write
from toolchain.wheels import wheel_checks
from toolchain.errors import BuildError
from toolchain.image.venv_layer import check_conflicts, in_scheme, wheels_of


def _only(wheel: Path, tmp_path: Path) -> Path:
    """A wheelhouse holding WHEEL alone."""
    wh = tmp_path / "only"
    wh.mkdir(exist_ok=True)
    target = wh / wheel.name
    os.replace(wheel, target)
    return wh


def _refused(wh: Path, pattern: str, tmp_path: Path) -> None:
    """wheels_of (the build's first look), then the writer alone, refuse; no layer is left."""
    with pytest.raises(BuildError) as e:
        wheels = wheels_of(wh, "3.11")
        check_conflicts(wheels, PY, "/opt/venv")
        write(wheels, tmp_path / "store")
    assert "\n" not in str(e.value), str(e.value)
    assert __import__("re").search(pattern, str(e.value)), str(e.value)
    store = tmp_path / "store"
    assert not store.exists() or not list(store.iterdir())


@pytest.mark.parametrize("member", [
    "probepkg/../../../../bin/python3",                      # climbs from site-packages into bin/
    "probepkg/../../../../pyvenv.cfg",
])
def test_a_member_that_climbs_out_of_site_packages_is_refused(tmp_path, member):
    w = make_wheel(tmp_path, "probepkg", "1.0", {"probepkg/__init__.py": b"", member: b"#!/bin/sh\n"})
    wh = _only(w, tmp_path)
    _refused(wh, r"probepkg-1\.0-py3-none-any\.whl.*(climbs out of|outside the archive)", tmp_path)


def test_a_member_that_climbs_out_of_its_scheme_is_refused_by_the_writer_too(tmp_path):
    """`.data/scripts/../lib/...pth` stays inside the venv but leaves the scripts scheme (a .pth runs at
    every start): refused by the zip-directory check and by the writer, each on its own."""
    evil = "probepkg-1.0.data/scripts/../lib/python3.11/site-packages/zz-evil.pth"
    w = make_wheel(tmp_path, "probepkg", "1.0", {"probepkg/__init__.py": b"", evil: b"import os\n"})
    with pytest.raises(BuildError, match=r"probepkg-1\.0-py3-none-any\.whl: the member .*climbs out of /opt/venv/bin"):
        check_conflicts([w], PY, "/opt/venv")
    with pytest.raises(BuildError, match=r"climbs out of /opt/venv/bin"):
        write([w], tmp_path / "store")
    assert not list((tmp_path / "store").iterdir())


def test_names_are_normalised_and_two_spellings_of_one_path_conflict(tmp_path):
    a = make_wheel(tmp_path, "aaa", "1.0", {"sharedns/./x.py": b"A = 1\n"})
    b = make_wheel(tmp_path, "bbb", "1.0", {"sharedns/x.py": b"B = 2\n"})
    with pytest.raises(BuildError, match=r"aaa-1\.0-py3-none-any\.whl and bbb-1\.0-py3-none-any\.whl both install "
                                         r"/opt/venv/.*/sharedns/x\.py"):
        check_conflicts([a, b], PY, "/opt/venv")
    layers_, _ = write([a], tmp_path / "store")
    names = [m.name for m in members(layers_[0].path)]
    assert f"{SITE}/sharedns/x.py" in names and not any("/./" in n or n.endswith("/..") for n in names)


def _forge_crc32(data: bytes, wanted: int) -> bytes:
    """Four bytes that, appended to DATA, give the CRC-32 WANTED (the register run backwards)."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    top = {table[i] >> 24: i for i in range(256)}
    w, picks = wanted ^ 0xFFFFFFFF, []
    for _ in range(4):
        picks.append(top[w >> 24])
        w = ((w ^ table[picks[-1]]) << 8) & 0xFFFFFFFF
    crc, out = zlib.crc32(data) ^ 0xFFFFFFFF, bytearray()
    for i in reversed(picks):
        out.append((crc ^ i) & 0xFF)
        crc = (crc >> 8) ^ table[i]
    return bytes(out)


def test_two_wheels_whose_one_path_differs_only_past_its_crc_conflict(tmp_path):
    """Equal size and CRC-32, other bytes: the RECORD's sha256 tells them apart."""
    good = b"mode = 'safe' ......."
    evil = b"mode = 'evil' ..."
    evil += _forge_crc32(evil, zlib.crc32(good))
    assert len(evil) == len(good) and zlib.crc32(evil) == zlib.crc32(good) and evil != good
    a = make_wheel(tmp_path, "one", "1.0", {"shared/conf.txt": good})
    b = make_wheel(tmp_path, "two", "1.0", {"shared/conf.txt": evil})
    with pytest.raises(BuildError, match=r"one-1\.0-py3-none-any\.whl and two-1\.0-py3-none-any\.whl both install "
                                         r"/opt/venv/.*/shared/conf\.txt, with different contents"):
        check_conflicts([a, b], PY, "/opt/venv")


def test_a_console_script_may_not_hide_a_file_or_another_wheel_s_script(tmp_path):
    tool = make_wheel(tmp_path, "tool", "1.0", {"tool-1.0.data/scripts/runme": b"#!python\nprint('data script')\n"})
    cli = make_wheel(tmp_path, "cli", "1.0", {"cli/__init__.py": b""}, entry_points="[console_scripts]\nrunme = cli:main\n")
    cli2 = make_wheel(tmp_path, "clitwo", "1.0", {"clitwo/__init__.py": b""},
                      entry_points="[console_scripts]\nrunme = clitwo:main\n")
    with pytest.raises(BuildError, match=r"tool-1\.0-py3-none-any\.whl and cli-1\.0-py3-none-any\.whl both install "
                                         r"/opt/venv/bin/runme, \(a file, and a console script over it\)"):
        check_conflicts([tool, cli], PY, "/opt/venv")
    with pytest.raises(BuildError, match=r"cli-1\.0-py3-none-any\.whl and clitwo-1\.0-py3-none-any\.whl both install "
                                         r"/opt/venv/bin/runme, as console scripts"):
        check_conflicts([cli, cli2], PY, "/opt/venv")
    check_conflicts([tool], PY, "/opt/venv")  # alone, each is fine
    check_conflicts([cli], PY, "/opt/venv")


def test_in_scheme_keeps_every_name_inside_and_normalised():
    root = "/opt/venv/bin"

    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(st.lists(st.sampled_from(["a", "..", ".", "", "b.pth", "python3"]), min_size=1, max_size=6))
    def check(parts):
        path = "/".join(parts)
        try:
            name = in_scheme(root, path, "w.whl")
        except BuildError as e:
            assert "climbs out of /opt/venv/bin" in str(e)
            return
        assert name.startswith("opt/venv/bin/") and os.path.normpath(name) == name
    check()


@pytest.mark.parametrize("script", ["python3", "python", "python3.11", "..", ".", "-rf", "a b"])
def test_a_console_script_name_that_is_not_a_plain_file_name_is_refused(tmp_path, script):
    w = make_wheel(tmp_path, "scripty", "1.0", {"scripty/__init__.py": b""},
                   entry_points=f"[console_scripts]\n{script} = scripty:main\n")
    with pytest.raises(BuildError, match=r"scripty-1\.0-py3-none-any\.whl.*console script name"):
        write([w], tmp_path / "store")


def test_ordinary_console_script_names_are_taken(tmp_path):
    w = make_wheel(tmp_path, "scripty", "1.0", {"scripty/__init__.py": b""},
                   entry_points="[console_scripts]\nconvert-caffe2-to-onnx = scripty:main\nf2py = scripty:main\n"
                                "markdown_py = scripty:main\npython-config-x = scripty:main\n")
    layers_, top = write([w], tmp_path / "store")
    with tarfile.open(fileobj=__import__("io").BytesIO(top.data)) as tf:
        names = tf.getnames()
    assert {"opt/venv/bin/convert-caffe2-to-onnx", "opt/venv/bin/f2py", "opt/venv/bin/markdown_py"} <= set(names)


def _rewrite(wheel: Path, members_: list[tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members_:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


def _contents(wheel: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(wheel) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def test_a_member_twice_in_one_wheel_is_refused(tmp_path):
    w = make_wheel(tmp_path, "twice", "1.0", {"twice/__init__.py": b"A = 1\n"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        _rewrite(w, _contents(w) + [("twice/__init__.py", b"A = 2\n")])
    _refused(_only(w, tmp_path), r"twice-1\.0-py3-none-any\.whl: has the member 'twice/__init__\.py' twice", tmp_path)


def test_a_record_that_lists_another_wheel_s_file_is_refused(tmp_path):
    w = make_wheel(tmp_path, "liar", "1.0", {"liar/__init__.py": b""})
    fixed = [(n, d + b"torch/__init__.py,sha256=AAAA,10\n" if n.endswith("RECORD") else d) for n, d in _contents(w)]
    _rewrite(w, fixed)
    _refused(_only(w, tmp_path), r"liar-1\.0-py3-none-any\.whl: its RECORD lists 'torch/__init__\.py'", tmp_path)


def test_a_member_whose_bytes_differ_from_its_record_line_is_refused(tmp_path):
    """Same size, other bytes, the zip's CRC-32 made to match: only the RECORD's sha256 tells."""
    w = make_wheel(tmp_path, "altered", "1.0", {"altered/__init__.py": b"VALUE = 'good'\n"})
    _rewrite(w, [(n, b"VALUE = 'evil'\n" if n == "altered/__init__.py" else d) for n, d in _contents(w)])
    _refused(_only(w, tmp_path), r"altered-1\.0-py3-none-any\.whl: /opt/venv/.*altered/__init__\.py does not match "
                                 r"the sha256 its RECORD gives", tmp_path)


def _with_record(wheel: Path, edit) -> None:
    """WHEEL with its RECORD's text passed through EDIT."""
    _rewrite(wheel, [(n, edit(d.decode()).encode() if n.endswith(".dist-info/RECORD") else d)
                     for n, d in _contents(wheel)])


@pytest.mark.parametrize("edit,says", [
    # other bytes of another size, the RECORD as it was: refused, not taken unverified
    (None, r"its RECORD gives 'rec/__init__\.py' the size '15'; the archive holds 30 bytes"),
    (lambda r: r.replace(",sha256=", ",md5=", 1), r"its RECORD gives 'rec/__init__\.py' the hash 'md5=.*not a sha256"),
    (lambda r: r.replace("rec/__init__.py,sha256=", "rec/__init__.py,sha256=xx", 1), r"not a sha256"),
    (lambda r: r.replace("rec/__init__.py,", "rec/__init__.py,,", 1), r"its RECORD has a malformed row"),
    (lambda r: "\n".join(l for l in r.splitlines() if not l.startswith("rec/__init__.py,")),
     r"its RECORD gives no hash for 'rec/__init__\.py'"),
    (lambda r: "\n".join("rec/__init__.py,," if l.startswith("rec/__init__.py,") else l for l in r.splitlines()),
     r"its RECORD gives no hash for 'rec/__init__\.py'"),
    (lambda r: "\n".join(l if not l.startswith("rec/__init__.py,") else l.rsplit(",", 1)[0] + ",999"
                          for l in r.splitlines()), r"its RECORD gives 'rec/__init__\.py' the size '999'"),
    (lambda r: r + "\n\"a,b\n", r"its RECORD has a malformed row"),
])
def test_record_is_checked_as_installer_checks_it(tmp_path, edit, says):
    """Every member but RECORD has a sha256 in RECORD, its size where one is given, rows well formed; each
    failure is one line naming the wheel, before anything is written."""
    w = make_wheel(tmp_path, "rec", "1.0", {"rec/__init__.py": b"VALUE = 'good'\n"})
    if edit is not None:
        _with_record(w, edit)
    else:
        _rewrite(w, [(n, b"VALUE = 'a longer evil value'\n" if n == "rec/__init__.py" else d) for n, d in _contents(w)])
    _refused(_only(w, tmp_path), r"rec-1\.0-py3-none-any\.whl: .*" + says, tmp_path)


def test_a_record_too_big_to_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(wheel_checks, "MAX_RECORD", 100)
    w = make_wheel(tmp_path, "bigrec", "1.0", {"bigrec/__init__.py": b""})
    _refused(_only(w, tmp_path), r"bigrec-1\.0-py3-none-any\.whl: its RECORD is \d+ bytes \(at most 100\)", tmp_path)


def test_an_altered_data_script_is_refused(tmp_path):
    """A .data/scripts file is rewritten in memory (its #! line): its bytes are checked before that."""
    w = make_wheel(tmp_path, "scr", "1.0", {"scr-1.0.data/scripts/scr-tool": b"#!python\nprint('good')\n"})
    _rewrite(w, [(n, b"#!python\nprint('evil')\n" if n.endswith("scr-tool") else d) for n, d in _contents(w)])
    _refused(_only(w, tmp_path), r"scr-1\.0-py3-none-any\.whl: /scr-1\.0\.data/scripts/scr-tool does not match the "
                                 r"sha256 its RECORD gives", tmp_path)


@pytest.mark.parametrize("name,ok", [
    ("tagged-1.0-cp27-cp27m-win32.whl", False),
    ("tagged-1.0-cp312-cp312-manylinux_2_17_x86_64.whl", False),
    ("tagged-1.0-cp311-cp311-macosx_11_0_arm64.whl", False),
    ("tagged-1.0-cp311-cp311-manylinux_2_39_x86_64.whl", False),   # needs a newer glibc than the base's 2.36
    ("tagged-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("tagged-1.0-cp310-abi3-manylinux_2_28_x86_64.whl", True),
    ("tagged-1.0-py3-none-manylinux2010_x86_64.whl", True),
    ("tagged-1.0-py2.py3-none-any.whl", True),
])
def test_a_wheel_s_tags_must_fit_the_image_s_python_and_platform(tmp_path, name, ok):
    made = make_wheel(tmp_path, "tagged", "1.0", {"tagged/__init__.py": b""})
    wheel = made.rename(tmp_path / name)
    if ok:
        wheel_checks.check_wheel(wheel, "3.11")
    else:
        with pytest.raises(BuildError, match=rf"{name.replace('.', '[.]')}: is built for .*not for CPython 3\.11"):
            wheel_checks.check_wheel(wheel, "3.11")


def test_the_example_s_real_wheels_pass(example_wheels):
    assert len(example_wheels) >= 40  # the example's set: torch, its CUDA libraries, ray, ...
    for w in example_wheels:
        wheel_checks.check_wheel(w, "3.11")


@pytest.mark.parametrize("case", ["not-a-zip", "truncated", "bad-name", "device", "html"])
def test_a_file_that_is_not_a_wheel_is_one_line_naming_it(tmp_path, case):
    wh = tmp_path / "wh"
    wh.mkdir()
    good = make_wheel(tmp_path, "fine", "1.0", {"fine/__init__.py": b"X = 1\n" * 1000})
    if case == "not-a-zip":
        (wh / "fine-1.0-py3-none-any.whl").write_bytes(os.urandom(4096))
        name = "fine-1.0-py3-none-any.whl"
    elif case == "truncated":
        data = good.read_bytes()
        (wh / good.name).write_bytes(data[: len(data) // 2])
        name = good.name
    elif case == "bad-name":
        good.rename(wh / "x.whl")
        name = "x.whl"
    elif case == "device":
        (wh / "zero-1.0-py3-none-any.whl").symlink_to("/dev/zero")
        name = "zero-1.0-py3-none-any.whl"
    else:
        (wh / "fine-1.0-py3-none-any.whl").write_text("<html><body>502 Bad Gateway</body></html>\n")
        name = "fine-1.0-py3-none-any.whl"
    with pytest.raises(BuildError) as e:
        wheels_of(wh, "3.11")
    assert "\n" not in str(e.value) and name in str(e.value)


def test_a_zip_bomb_member_is_refused_before_it_is_inflated(tmp_path):
    w = make_wheel(tmp_path, "bomb", "1.0", {"bomb/__init__.py": b""})
    _rewrite(w, _contents(w) + [("bomb/zeros.bin", bytes(wheel_checks.BOMB_MIN))])
    _refused(_only(w, tmp_path), r"bomb-1\.0-py3-none-any\.whl: its member 'bomb/zeros\.bin' inflates \d+ times", tmp_path)


def test_overlapping_members_are_refused(tmp_path):
    """Two directory entries naming one stretch of data (CPython 3.12's zipfile refuses it; 3.11's reads it)."""
    w = make_wheel(tmp_path, "overlap", "1.0", {"overlap/a.py": b"A = 1\n", "overlap/b.py": b"B = 2\n"})
    data = bytearray(w.read_bytes())
    entries = [i for i in range(len(data)) if data[i:i + 4] == b"PK\x01\x02"]
    first = struct.unpack_from("<I", data, entries[0] + 42)[0]
    struct.pack_into("<I", data, entries[1] + 42, first)  # the second entry points at the first's data
    w.write_bytes(bytes(data))
    _refused(_only(w, tmp_path), r"overlap-1\.0-py3-none-any\.whl: the data of its members .* overlap", tmp_path)


def test_a_module_too_big_to_compile_is_written_in_pieces_without_bytecode(tmp_path):
    big = b"# padding\n" * (wheel_checks.MAX_COMPILED // 10 + 1)
    w = make_wheel(tmp_path, "huge", "1.0", {"huge/__init__.py": b"", "huge/gen.py": big})
    layers_, _ = write([w], tmp_path / "store", compile=True)
    names = [m.name for m in members(layers_[0].path)]
    assert f"{SITE}/huge/gen.py" in names
    assert not any("gen.cpython" in n for n in names) and any("__init__.cpython" in n for n in names)


def test_a_script_too_big_to_rewrite_in_memory_is_refused(tmp_path):
    script = b"#!python\n" + b"#" * wheel_checks.MAX_SCRIPT
    w = make_wheel(tmp_path, "bigscript", "1.0", {"bigscript/__init__.py": b"", "bigscript-1.0.data/scripts/tool": script})
    with pytest.raises(BuildError, match=r"bigscript-1\.0-py3-none-any\.whl: the script .*tool' is \d+ bytes"):
        write([w], tmp_path / "store")


_PART = st.sampled_from(["pkg", "..", ".", "", "a.py", "x.pth", "probe-1.0.data", "scripts", "purelib", "data",
                         "headers", "bin", "\\", "C:", "\x00", "lib"])


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(st.lists(st.lists(_PART, min_size=1, max_size=6).map("/".join), min_size=1, max_size=4))
def test_any_member_names_are_refused_in_one_line_or_land_inside_their_scheme(tmp_path_factory, names):
    """Whatever the member names, a wheel is either refused before anything is written, with one line naming
    it, or each of its files lands inside the venv under a normalised name."""
    from toolchain.image.venv_layer import _installed
    where = tmp_path_factory.mktemp("w")
    files = {n: b"x = 1\n" for n in names}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns of a name written twice
            wheel = make_wheel(where, "probe", "1.0", {"probe/__init__.py": b"", **files})
    except (ValueError, OSError):
        return  # zipfile itself cannot write such a name
    try:
        wheel_checks.check_wheel(wheel, "3.11")
        landed = [name for _, name in _installed(wheel, PY, "/opt/venv")]
    except BuildError as e:
        assert "\n" not in str(e) and wheel.name in str(e)
        return
    for name in landed:
        assert name.startswith("opt/venv/") and os.path.normpath(name) == name and "\x00" not in name

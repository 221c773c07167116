"""Hostile and broken wheels (toolchain/wheel_checks.py, toolchain/venv_layer.py): each is refused with one
line naming the wheel's file, before a layer is written, and leaves no layer behind. Engine-free."""
from __future__ import annotations

import os
import struct
import warnings
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.test_venv_layer import PY, SITE, make_wheel, members, write
from toolchain import wheel_checks
from toolchain.errors import BuildError
from toolchain.venv_layer import check_conflicts, in_scheme, wheels_of


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
    from toolchain.venv_layer import _installed
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

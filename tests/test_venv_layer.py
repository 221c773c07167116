"""The dependency layer assembled directly from wheels (toolchain/venv_layer.py), engine-free: the same
wheel set gives the same bytes from any checkout, and the tar holds a venv as an installer makes it.
The full layer, from the real 3.9 GiB wheelhouse, is exercised by every image test (tests/test_images.py
runs the selfcheck, which imports torch and ray from it)."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import marshal
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from toolchain import bytecode
from toolchain.bytecode import host_can_compile
from toolchain.errors import BuildError
from toolchain.venv_layer import Python, planned_modules, wheels_of, write_venv_layer

PY = Python("3.11.2", "/usr/bin/python3")
SITE = "opt/venv/lib/python3.11/site-packages"


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(where: Path, dist: str, version: str, files: dict[str, bytes], executable: frozenset = frozenset(),
               entry_points: str = "") -> Path:
    """A real wheel (zip, WHEEL, METADATA, RECORD), as a build backend writes one."""
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points:
        members[f"{info}/entry_points.txt"] = entry_points.encode()
    record = "\n".join(record_line(n, d) for n, d in members.items()) + f"\n{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    path = where / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100755 if name in executable else 0o100644) << 16
            z.writestr(zi, data)
    return path


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    make_wheel(wh, "alpha", "1.0", {"alpha/__init__.py": b"VALUE = 1\n", "alpha/native.so": os.urandom(3000),
                                    "alpha-1.0.data/scripts/alpha-tool": b"#!python\nprint('tool')\n",
                                    "alpha-1.0.data/data/share/alpha/notes.txt": b"notes\n"},
               executable=frozenset({"alpha/native.so", "alpha-1.0.data/scripts/alpha-tool"}),
               entry_points="[console_scripts]\nalpha = alpha.cli:main\n")
    make_wheel(wh, "beta", "2.0", {"beta.py": b"import alpha\n", "nspkg/__init__.py": b""})
    make_wheel(wh, "gamma", "0.1", {"nspkg/__init__.py": b"", "nspkg/gamma.py": b"G = 3\n"})
    return wh


def members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return tf.getmembers()


def test_the_same_wheel_set_gives_the_same_layer_from_any_checkout(wheelhouse, tmp_path):
    first = write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", tmp_path / "store-a")
    # another checkout: the wheels copied elsewhere, with other mtimes, other directory order
    other = tmp_path / "elsewhere" / "wheels"
    other.mkdir(parents=True)
    for i, w in enumerate(sorted(wheelhouse.iterdir())):  # newest first: mtime order is the reverse of name order
        shutil.copy(w, other / w.name)
        os.utime(other / w.name, (1_700_000_000 - i, 1_700_000_000 - i))
    second = write_venv_layer(wheels_of(other), PY, "/opt/venv", tmp_path / "store-b")
    assert first.diff_id == second.diff_id
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.diff_id == "sha256:" + hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.path.name == f"{first.diff_id[7:]}.tar" and first.size == first.path.stat().st_size
    # and it depends on what is installed: another interpreter path gives another layer
    third = write_venv_layer(wheels_of(wheelhouse), Python("3.11.2", "/usr/local/bin/python3"), "/opt/venv",
                             tmp_path / "store-c")
    assert third.diff_id != first.diff_id


def test_the_tar_is_normalised_and_holds_no_bytecode(wheelhouse, tmp_path):
    layer = write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", tmp_path / "store")
    seen_dirs: set[str] = set()
    for m in members(layer.path):
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert not m.name.endswith((".pyc", ".pyo")) and "__pycache__" not in m.name
        parent = os.path.dirname(m.name)
        assert parent in seen_dirs or parent == "", f"{m.name} comes before its directory"
        if m.isdir():
            seen_dirs.add(m.name)
            assert m.mode == 0o755
        elif m.isfile():
            assert m.mode in (0o644, 0o755)


def test_the_tar_is_a_venv_as_an_installer_makes_it(wheelhouse, tmp_path):
    layer = write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", tmp_path / "store")
    root = tmp_path / "root"
    with tarfile.open(layer.path) as tf:
        by_name = {m.name: m for m in tf.getmembers()}
        tf.extractall(root, filter="tar")
    venv = root / "opt/venv"
    assert os.readlink(venv / "bin/python3") == "/usr/bin/python3"
    assert os.readlink(venv / "bin/python") == "python3" and os.readlink(venv / "bin/python3.11") == "python3"
    assert os.readlink(venv / "lib64") == "lib"
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines())
    assert cfg["home"] == "/usr/bin" and cfg["version"] == "3.11.2" and cfg["include-system-site-packages"] == "false"
    # an entry point's console script, and a .data script with its shebang rewritten, both executable
    assert (venv / "bin/alpha").read_text().startswith("#!/opt/venv/bin/python\n")
    assert "from alpha.cli import main" in (venv / "bin/alpha").read_text()
    assert (venv / "bin/alpha-tool").read_text() == "#!/opt/venv/bin/python\nprint('tool')\n"
    assert by_name["opt/venv/bin/alpha"].mode == by_name["opt/venv/bin/alpha-tool"].mode == 0o755
    assert by_name[f"{SITE}/alpha/native.so"].mode == 0o755
    assert by_name[f"{SITE}/alpha/__init__.py"].mode == 0o644
    assert (venv / "share/alpha/notes.txt").read_text() == "notes\n"   # the data scheme is the venv's root
    # every installed file is in its RECORD with its real hash and size, and the INSTALLER is ours
    site = root / SITE
    for dist in ("alpha-1.0", "beta-2.0", "gamma-0.1"):
        info = site / f"{dist}.dist-info"
        assert (info / "INSTALLER").read_text() == "raytrain\n"
        for line in (info / "RECORD").read_text().splitlines():
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = (site / name).resolve().read_bytes()
            assert record_line(name, data) == line, name
    # importlib.metadata reads the installed distributions the way pip and users do
    import importlib.metadata as md
    dists = {d.metadata["Name"]: d for d in md.distributions(path=[str(site)])}
    assert sorted(dists) == ["alpha", "beta", "gamma"]
    assert [ep.value for ep in dists["alpha"].entry_points] == ["alpha.cli:main"]


def test_a_file_two_wheels_ship_alike_is_in_the_layer_once(wheelhouse, tmp_path):
    """beta and gamma both ship nspkg/__init__.py, empty, as nvidia-* wheels all ship nvidia/__init__.py:
    the engine refuses a layer that names a path twice."""
    names = [m.name for m in members(write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", tmp_path / "s").path)]
    assert len(names) == len(set(names))
    assert f"{SITE}/nspkg/__init__.py" in names and f"{SITE}/nspkg/gamma.py" in names


def test_a_file_two_wheels_ship_differently_is_refused_naming_both(wheelhouse, tmp_path):
    make_wheel(wheelhouse, "epsilon", "1.0", {"nspkg/__init__.py": b"X = 1\n"})
    store = tmp_path / "store"
    with pytest.raises(BuildError, match=r"beta-2\.0-py3-none-any\.whl and epsilon-1\.0-py3-none-any\.whl both "
                                         r"install /opt/venv/.*/nspkg/__init__\.py.*Remove one"):
        write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", store)
    assert list(store.iterdir()) == []


def test_two_versions_of_one_distribution_are_refused(wheelhouse):
    make_wheel(wheelhouse, "alpha", "1.1", {"alpha/__init__.py": b"VALUE = 2\n"})
    with pytest.raises(BuildError, match=r"two wheels of alpha: alpha-1\.0-.*alpha-1\.1-.*delete"):
        wheels_of(wheelhouse)


def test_a_broken_wheel_is_named_and_leaves_no_layer(wheelhouse, tmp_path):
    bad = wheelhouse / "delta-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:  # no WHEEL file: not a wheel an installer accepts
        z.writestr("delta/__init__.py", b"")
        z.writestr("delta-1.0.dist-info/METADATA", b"Name: delta\nVersion: 1.0\n")
        z.writestr("delta-1.0.dist-info/RECORD", b"")
    store = tmp_path / "store"
    with pytest.raises(BuildError, match="delta-1.0-py3-none-any.whl"):
        write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", store)
    assert list(store.iterdir()) == []


def test_the_base_interpreter_line_is_parsed_strictly():
    got = Python.parse("3.11.2 /usr/bin/python3 a70d0d0a cpython-311\n", "base")
    assert got == Python("3.11.2", "/usr/bin/python3", "a70d0d0a", "cpython-311")
    assert got.minor == "3.11"
    for line in ("", "Python 3.11.2", "3.11.2 python3", "3.11.2 /usr/bin/python3", "3.11.2 /usr/bin/python3 extra",
                 "3.11.2 /usr/bin/python3 a70d0d0a cpython-311 extra", "3.11.2 /usr/bin/python3 a70d0d0 cpython-311",
                 "2.7.18 /usr/bin/python 03f30d0a cpython-27"):
        with pytest.raises(BuildError, match="base image's Python"):
            Python.parse(line, "base")


def test_a_wheel_that_writes_outside_the_venv_is_refused(wheelhouse, tmp_path):
    make_wheel(wheelhouse, "zeta", "1.0", {"zeta/__init__.py": b"", "../../../../../etc/zeta.conf": b"x\n"})
    store = tmp_path / "store"
    with pytest.raises(BuildError, match=r"zeta-1\.0-py3-none-any\.whl.*outside opt/venv"):
        write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", store)
    assert list(store.iterdir()) == []


def test_the_host_compiles_every_module_under_lib_as_compileall_would(wheelhouse, tmp_path):
    """Modules handed over while the layer is written come back as unchecked-hash .pyc files in their
    __pycache__, named by the path in the image; scripts are not compiled; a broken module is counted."""
    make_wheel(wheelhouse, "broken", "1.0", {"broken/__init__.py": b"print 'python 2'\n"})
    compiler = bytecode.HostCompiler(sys.implementation.cache_tag, workers=2)
    layer = write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", tmp_path / "store", compiler=compiler)
    pyc_layer, failed = compiler.layer()
    assert failed == 1
    with tarfile.open(layer.path) as tf:
        sources = {m.name: tf.extractfile(m).read() for m in tf.getmembers()
                   if m.isfile() and m.name.endswith(".py") and m.name != f"{SITE}/broken/__init__.py"}
    assert f"{SITE}/alpha/__init__.py" in sources and not any(n.startswith("opt/venv/bin/") for n in sources)
    tag = sys.implementation.cache_tag
    with tarfile.open(fileobj=io.BytesIO(pyc_layer.data)) as tf:
        pycs = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    assert sorted(pycs) == sorted(bytecode.pyc_name(n, tag) for n in sources)
    assert f"{SITE}/alpha/__pycache__/__init__.{tag}.pyc" in pycs
    for name, source in sources.items():
        data = pycs[bytecode.pyc_name(name, tag)]
        assert data[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(data[4:8], "little") == 0b01  # hash-based, not checked against the source
        assert data[8:16] == importlib.util.source_hash(source)
        code = marshal.loads(data[16:])
        assert code.co_filename == "/" + name
        assert code.co_code == compile(source, "/" + name, "exec", dont_inherit=True).co_code


def test_the_host_compiles_only_for_the_image_s_bytecode():
    magic, tag = importlib.util.MAGIC_NUMBER.hex(), sys.implementation.cache_tag
    assert host_can_compile(magic, tag)
    assert not host_can_compile("cb0d0d0a", tag)  # 3.12's magic
    assert not host_can_compile(magic, "cpython-312")


def test_a_damaged_wheel_member_is_named_and_leaves_no_layer(wheelhouse, tmp_path):
    """Members are inflated by toolchain/wheel_members.py, not zipfile: its CRC-32 check is theirs too."""
    wheel = make_wheel(wheelhouse, "omega", "1.0", {"omega/__init__.py": b"VALUE = 'intact'\n"})
    data = wheel.read_bytes()
    with zipfile.ZipFile(wheel) as z:  # a stored copy, then one byte of the member changed, sizes kept
        members = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for name, content in members.items():
            z.writestr(name, content)
    data = wheel.read_bytes()
    at = data.index(b"VALUE = 'intact'")
    wheel.write_bytes(data[:at] + b"VALUE = 'broken'" + data[at + 16:])
    store = tmp_path / "store"
    with pytest.raises(BuildError, match=r"omega/__init__\.py does not match its CRC-32.*delete it"):
        write_venv_layer(wheels_of(wheelhouse), PY, "/opt/venv", store)
    assert list(store.iterdir()) == []


def _pycs(layer) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(layer.data)) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


def test_the_planned_modules_are_those_written_and_compile_alike(wheelhouse, tmp_path):
    """The modules read from the zips' directories before the write (compiled from the start) are the ones
    the installer writes under lib/: a .data/purelib member in site-packages, no script. A plan that
    misses a module (its source is handed over as written) or names one never written gives the same layer."""
    make_wheel(wheelhouse, "delta", "1.0", {"delta/__init__.py": b"", "delta-1.0.data/purelib/delta_extra.py": b"E = 1\n",
                                            "delta-1.0.data/scripts/delta.py": b"print(1)\n"})
    wheels = wheels_of(wheelhouse)
    plan = planned_modules(wheels, PY, "/opt/venv")
    planned = {name for _, members in plan for _, name in members}
    layer = write_venv_layer(wheels, PY, "/opt/venv", tmp_path / "s0")
    written = {m.name for m in members(layer.path) if m.isfile() and m.name.endswith(".py") and m.name.startswith("opt/venv/lib/")}
    assert planned == written and f"{SITE}/delta_extra.py" in planned
    tag = sys.implementation.cache_tag
    lacking = [(w, ms[1:]) for w, ms in plan]                          # each wheel's first module left out
    extra = [(w, ms + [(ms[0][0], f"{SITE}/never/written.py")]) for w, ms in plan if ms]
    out = []
    for i, p in enumerate((plan, lacking, extra, ())):
        compiler = bytecode.HostCompiler(tag, workers=2, planned=p)
        write_venv_layer(wheels, PY, "/opt/venv", tmp_path / f"s{i + 1}", compiler=compiler)
        out.append(_pycs(compiler.layer()[0]))
    assert sorted(out[0]) == sorted(bytecode.pyc_name(n, tag) for n in written)
    for other in out[1:]:
        assert sorted(other) == sorted(out[0])
        assert all(marshal.loads(other[n][16:]).co_code == marshal.loads(out[0][n][16:]).co_code for n in other)

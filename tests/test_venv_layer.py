"""The dependency layers assembled directly from wheels (toolchain/image/venv_layer.py, toolchain/image/venv_plan.py),
engine-free: a wheel gives the same layer bytes from any checkout, and the layers together hold a venv as
an installer makes it. The real layers, from the 3.9 GiB wheelhouse, are exercised by every image test
(tests/test_images.py runs the selfcheck, which imports torch and ray from them)."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import marshal
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from toolchain.image import bytecode
from toolchain.image.bytecode import host_can_compile
from toolchain.errors import BuildError
from toolchain.image import venv_plan
from toolchain.image.venv_layer import LayerWriter, Python, check_conflicts, planned_modules, top_layer, wheels_of

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


def write(wheels: list[Path], store: Path, compile: bool = False, python: Python = PY):
    """Each wheel's layer (as the build writes them, bytecode compiled by the host's workers with COMPILE),
    then the venv's top layer: ([FileLayer per wheel], top Layer)."""
    compiler = bytecode.HostCompiler(workers=2, planned=planned_modules(wheels, python, "/opt/venv")) if compile else None
    out, scripts = [], []
    try:
        for w in wheels:
            writer = LayerWriter([w], python, "/opt/venv", store, compiler.planned_of([w]) if compiler else set())
            try:
                writer.files()
                out.append(writer.finish(compiler, sys.implementation.cache_tag))
            except BaseException:
                writer.abort()
                raise
            scripts += writer.out.scripts
    finally:
        if compiler is not None:
            compiler.close()
    return out, top_layer(python, "/opt/venv", scripts)


def extract(layers_, top, root: Path) -> dict[str, tarfile.TarInfo]:
    """The layers applied in order into ROOT (no whiteouts: they add files only); the members by name."""
    by_name = {}
    for data in [l.path.read_bytes() for l in layers_] + [top.data]:
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            by_name.update({m.name: m for m in tf.getmembers()})
            tf.extractall(root, filter="tar")
    return by_name


def test_a_wheel_gives_the_same_layer_from_any_checkout_and_any_run(wheelhouse, tmp_path):
    """Two checkouts (the wheels copied elsewhere, other mtimes), each compiling its bytecode in its own
    worker processes: every wheel's layer is the same, byte for byte."""
    first, top1 = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store-a", compile=True)
    other = tmp_path / "elsewhere" / "wheels"
    other.mkdir(parents=True)
    for i, w in enumerate(sorted(wheelhouse.iterdir())):
        shutil.copy(w, other / w.name)
        os.utime(other / w.name, (1e9 - i, 1e9 - i))
    second, top2 = write(wheels_of(other, "3.11"), tmp_path / "store-b", compile=True)
    assert [l.diff_id for l in first] == [l.diff_id for l in second] and top1.diff_id == top2.diff_id
    assert all("sha256:" + hashlib.sha256(l.path.read_bytes()).hexdigest() == l.diff_id for l in first)
    # another base interpreter changes only the top layer (bin/python3 -> it; pyvenv.cfg)
    third, top3 = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store-c", python=Python("3.11.2", "/usr/local/bin/python3"))
    plain, _ = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store-d")
    assert [l.diff_id for l in third] == [l.diff_id for l in plain] and top3.diff_id != top1.diff_id


def test_the_tars_are_normalised_and_bytecode_only_when_compiled(wheelhouse, tmp_path):
    layers_, top = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store")
    for data in [l.path.read_bytes() for l in layers_] + [top.data]:
        seen_dirs: set[str] = set()
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            for m in tf.getmembers():
                assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
                assert not m.name.endswith((".pyc", ".pyo")) and "__pycache__" not in m.name
                parent = os.path.dirname(m.name)
                assert parent in seen_dirs or parent == "", f"{m.name} comes before its directory"
                if m.isdir():
                    seen_dirs.add(m.name)
                    assert m.mode == 0o755
                elif m.isfile():
                    assert m.mode in (0o644, 0o755)


def test_the_layers_make_a_venv_as_an_installer_makes_it(wheelhouse, tmp_path):
    layers_, top = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store")
    root = tmp_path / "root"
    by_name = extract(layers_, top, root)
    venv = root / "opt/venv"
    assert os.readlink(venv / "bin/python3") == "/usr/bin/python3"
    assert os.readlink(venv / "bin/python") == "python3" and os.readlink(venv / "bin/python3.11") == "python3"
    assert os.readlink(venv / "lib64") == "lib"
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines())
    assert cfg["home"] == "/usr/bin" and cfg["version"] == "3.11.2" and cfg["include-system-site-packages"] == "false"
    # an entry point's console script (in the top layer), and a .data script with its shebang rewritten
    # (in its wheel's layer), both executable
    assert (venv / "bin/alpha").read_text().startswith("#!/opt/venv/bin/python\n")
    assert "from alpha.cli import main" in (venv / "bin/alpha").read_text()
    with tarfile.open(fileobj=io.BytesIO(top.data)) as tf:
        assert "opt/venv/bin/alpha" in tf.getnames()
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
    import importlib.metadata as md
    dists = {d.metadata["Name"]: d for d in md.distributions(path=[str(site)])}
    assert sorted(dists) == ["alpha", "beta", "gamma"]
    assert [ep.value for ep in dists["alpha"].entry_points] == ["alpha.cli:main"]


def test_a_file_two_wheels_ship_alike_is_in_each_wheel_s_layer(wheelhouse, tmp_path):
    """beta and gamma both ship nspkg/__init__.py, empty, as nvidia-* wheels all ship nvidia/__init__.py:
    each layer holds its own copy (a wheel's layer depends on that wheel alone), and a group layer that
    holds both names the path once (the engine refuses a path twice in one layer)."""
    wheels = wheels_of(wheelhouse, "3.11")
    check_conflicts(wheels, PY, "/opt/venv")
    layers_, _ = write(wheels, tmp_path / "s")
    beta, gamma = ([m.name for m in members(l.path)] for l in layers_[1:])
    assert f"{SITE}/nspkg/__init__.py" in beta and f"{SITE}/nspkg/__init__.py" in gamma
    group = LayerWriter(wheels[1:], PY, "/opt/venv", tmp_path / "g").files().finish(None)
    names = [m.name for m in members(group.path)]
    assert len(names) == len(set(names)) and f"{SITE}/nspkg/gamma.py" in names


def test_a_file_two_wheels_ship_differently_is_refused_naming_both(wheelhouse):
    make_wheel(wheelhouse, "epsilon", "1.0", {"nspkg/__init__.py": b"X = 1\n"})
    with pytest.raises(BuildError, match=r"beta-2\.0-py3-none-any\.whl and epsilon-1\.0-py3-none-any\.whl both "
                                         r"install /opt/venv/.*/nspkg/__init__\.py.*Remove one"):
        check_conflicts(wheels_of(wheelhouse, "3.11"), PY, "/opt/venv")


def test_a_console_script_two_wheels_ship_differently_is_refused(wheelhouse, tmp_path):
    make_wheel(wheelhouse, "kappa", "1.0", {"kappa/__init__.py": b""}, entry_points="[console_scripts]\nalpha = kappa:main\n")
    with pytest.raises(BuildError, match=r"console script bin/alpha with different contents"):
        write(wheels_of(wheelhouse, "3.11"), tmp_path / "s")


def test_two_versions_of_one_distribution_are_refused(wheelhouse):
    make_wheel(wheelhouse, "alpha", "1.1", {"alpha/__init__.py": b"VALUE = 2\n"})
    with pytest.raises(BuildError, match=r"two wheels of alpha: alpha-1\.0-.*alpha-1\.1-.*delete"):
        wheels_of(wheelhouse, "3.11")


def _no_layer_left(store: Path) -> bool:
    return not store.exists() or not [p for p in store.iterdir()]


def test_a_broken_wheel_is_named_and_leaves_no_layer(wheelhouse, tmp_path):
    bad = wheelhouse / "delta-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:  # no WHEEL file: not a wheel an installer accepts
        z.writestr("delta/__init__.py", b"")
        z.writestr("delta-1.0.dist-info/METADATA", b"Name: delta\nVersion: 1.0\n")
        z.writestr("delta-1.0.dist-info/RECORD", b"")
    store = tmp_path / "store"
    with pytest.raises(BuildError, match="delta-1.0-py3-none-any.whl"):
        write([bad], store)
    assert _no_layer_left(store)


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
    zeta = make_wheel(wheelhouse, "zeta", "1.0", {"zeta/__init__.py": b"", "../../../../../etc/zeta.conf": b"x\n"})
    store = tmp_path / "store"
    with pytest.raises(BuildError, match=r"zeta-1\.0-py3-none-any\.whl.*climbs out of /opt/venv"):
        write([zeta], store)
    assert _no_layer_left(store)


def test_the_host_compiles_every_module_under_lib_as_compileall_would(wheelhouse, tmp_path):
    """Each wheel's layer ends with the unchecked-hash .pyc of its modules under lib/, in their
    __pycache__, named by the path in the image; scripts are not compiled; a broken module has none."""
    make_wheel(wheelhouse, "broken", "1.0", {"broken/__init__.py": b"print 'python 2'\n"})
    layers_, _ = write(wheels_of(wheelhouse, "3.11"), tmp_path / "store", compile=True)
    sources, pycs = {}, {}
    for l in layers_:
        with tarfile.open(l.path) as tf:
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith(".py"):
                    sources[m.name] = tf.extractfile(m).read()
                elif m.isfile() and m.name.endswith(".pyc"):
                    pycs[m.name] = tf.extractfile(m).read()
    del sources[f"{SITE}/broken/__init__.py"]
    assert f"{SITE}/alpha/__init__.py" in sources and not any(n.startswith("opt/venv/bin/") for n in sources)
    tag = sys.implementation.cache_tag
    assert sorted(pycs) == sorted(bytecode.pyc_name(n, tag) for n in sources)
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
    assert host_can_compile(magic, tag) and bytecode.identity(magic, tag)[0] == sys.version
    assert not host_can_compile("cb0d0d0a", tag)  # 3.12's magic
    assert not host_can_compile(magic, "cpython-312") and bytecode.identity(magic, "cpython-312") is None


PRISTINE = """
import importlib.util, marshal, sys
from importlib._bootstrap_external import _code_to_hash_pyc
out = {}
for name, source in marshal.loads(sys.stdin.buffer.read()):
    out[name] = bytes(_code_to_hash_pyc(compile(source, "/" + name, "exec", dont_inherit=True),
                                        importlib.util.source_hash(source), checked=False))
sys.stdout.buffer.write(marshal.dumps(out))
"""


def test_the_host_s_bytecode_is_what_a_pristine_interpreter_writes(tmp_path):
    """marshal flags a name by its reference count in the compiling process, so a module compiled where its
    own package, or another sharing its names, is loaded comes out as other bytes (pyyaml's, in a process
    that imported yaml: 3 of its 17 modules). The host's workers are interpreters of their own that load
    nothing of the tool or its environment: pyyaml's modules, which this tool imports itself, compile to
    what `python -I -S` of the same Python writes, whatever the building process has loaded."""
    import yaml  # noqa: F401 - loaded here, as in every build: it must not matter
    package = Path(yaml.__file__).parent
    sources = {f"opt/venv/lib/python3.11/site-packages/yaml/{f.name}": f.read_bytes() for f in sorted(package.glob("*.py"))}
    wheel = make_wheel(tmp_path, "pyyaml", "6.0", {n.split("site-packages/")[1]: b for n, b in sources.items()})
    members = [(n.split("site-packages/")[1], n) for n in sources]
    compiler = bytecode.HostCompiler(workers=1, planned=[(wheel, members)])
    try:
        host = compiler.of([wheel])
        unforeseen = compiler.compile(sorted(sources.items())[:3])
    finally:
        compiler.close()
    pristine = marshal.loads(subprocess.run([sys.executable, "-I", "-S", "-c", PRISTINE], check=True, capture_output=True,
                                            input=marshal.dumps(sorted(sources.items()))).stdout)
    assert len(host) == len(sources) > 10
    assert [n for n in sources if host[n] != pristine[n]] == []
    assert all(unforeseen[n] == pristine[n] for n in unforeseen)


def test_a_damaged_wheel_member_is_named_and_leaves_no_layer(wheelhouse, tmp_path):
    """Members are inflated by toolchain/image/wheel_members.py, not zipfile: its CRC-32 check is theirs too."""
    wheel = make_wheel(wheelhouse, "omega", "1.0", {"omega/__init__.py": b"VALUE = 'intact'\n"})
    with zipfile.ZipFile(wheel) as z:  # a stored copy, then one byte of the member changed, sizes kept
        content = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for name, data in content.items():
            z.writestr(name, data)
    data = wheel.read_bytes()
    at = data.index(b"VALUE = 'intact'")
    wheel.write_bytes(data[:at] + b"VALUE = 'broken'" + data[at + 16:])
    store = tmp_path / "store"
    with pytest.raises(BuildError, match=r"omega/__init__\.py does not match its CRC-32.*delete it"):
        write([wheel], store)
    assert _no_layer_left(store)


def test_the_planned_modules_are_those_written_and_an_unplanned_one_compiles_alike(wheelhouse, tmp_path):
    """The modules read from the zips' directories before the write (compiled from the start) are the ones
    the installer writes under lib/: a .data/purelib member in site-packages, no script. A module the
    plan missed is compiled by the writer itself, to the same bytes."""
    delta = make_wheel(wheelhouse, "delta", "1.0", {"delta/__init__.py": b"", "delta-1.0.data/purelib/delta_extra.py": b"E = 1\n",
                                                    "delta-1.0.data/scripts/delta.py": b"print(1)\n"})
    plan = planned_modules([delta], PY, "/opt/venv")
    planned = {name for _, ms in plan for _, name in ms}
    layers_, _ = write([delta], tmp_path / "s0", compile=True)
    written = {m.name for m in members(layers_[0].path) if m.isfile() and m.name.endswith(".py") and "/lib/" in m.name}
    assert planned == written and f"{SITE}/delta_extra.py" in planned
    compiler = bytecode.HostCompiler(workers=1, planned=[(delta, plan[0][1][1:])])  # the first module left out
    try:
        writer = LayerWriter([delta], PY, "/opt/venv", tmp_path / "s1", compiler.planned_of([delta]))
        lacking = writer.files().finish(compiler, sys.implementation.cache_tag)
    finally:
        compiler.close()
    assert lacking.diff_id == layers_[0].diff_id


def test_the_grouping_rule_looks_at_each_wheel_alone(wheelhouse, tmp_path):
    """Big wheels get a layer each, biggest first; small ones go to the group their name picks, so adding
    a small wheel changes its group's key and no other; a layer's key is the same in another project."""
    big = make_wheel(wheelhouse, "bigone", "1.0", {"bigone/data.bin": os.urandom(venv_plan.OWN_LAYER_BYTES)})
    wheels = wheels_of(wheelhouse, "3.11")
    sha = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    before, _ = venv_plan.plan(wheels, sha, "/opt/venv", "3.11", None)
    assert before[0].name == "bigone" and all(p.name.startswith("group-") for p in before[1:])
    new = make_wheel(wheelhouse, "newcomer", "0.1", {"newcomer.py": b"N = 1\n"})
    sha[new.name] = hashlib.sha256(new.read_bytes()).hexdigest()
    after, _ = venv_plan.plan(wheels_of(wheelhouse, "3.11"), sha, "/opt/venv", "3.11", None)
    changed = {p.name for p in after} ^ {p.name for p in before} | {
        a.name for a in after for b in before if a.name == b.name and a.key != b.key}
    assert changed == {f"group-{venv_plan.group_of(new)}"}
    elsewhere, _ = venv_plan.plan([big], sha, "/opt/venv", "3.11", None)  # another project: bigone alone
    assert elsewhere[0].key == before[0].key

"""The dependency layers assembled directly: each wheel installed into /opt/venv as a layer tar of its own.

No builder container and no `pip install` inside one: PyPA's `installer` unpacks each wheel (the
same library pip's own install is built on), and every file it would write goes straight into the
layer's tar in the layer store (`LayerWriter`, one per wheel or group of small wheels:
toolchain/image/venv_plan.py), so the venv is written once; the tar is hashed as it is written (its diff
ID), and a file's RECORD line keeps the wheel's own hash, as pip keeps it, where the wheel's RECORD
gives a sha256 for it (the member's bytes are checked against the zip's CRC-32 and size:
toolchain/image/wheel_members.py); only files the install writes or changes are hashed again. The .pyc of
the wheel's modules (toolchain/image/bytecode.py) follow its files in the same tar.

A layer depends on its wheels alone, and is reproducible, so a wheel gives the same diff ID in any
project, checkout and machine (with the same host Python for its bytecode):
  - each wheel's files in its own archive order (deterministic; a sorted tar would need the tree
    staged first), parent directories listed before their first file; the .pyc sorted by name;
  - mtime 0, uid/gid 0 with no names, modes 0755 (directories, executables) or 0644;
  - a file two wheels ship alike (nvidia/__init__.py) is in each one's layer; other bytes are refused
    before anything is written (`check_conflicts`).
What all the wheels share is the venv's top layer (`top_layer`): bin/python3 -> the base's
interpreter, bin/python and bin/python3.X -> python3, lib64 -> lib, pyvenv.cfg as `python -m venv`
makes them, and the console scripts (`#!/opt/venv/bin/python`). No pip and no activate scripts: PATH
and VIRTUAL_ENV are set in the image. The wheelhouse holds wheels only (toolchain/wheels/wheelhouse.py
downloads `--only-binary=:all:` and builds the few pure-Python sdists on the host), so no compiler is
ever needed here.
"""
from __future__ import annotations

import base64
import configparser
import hashlib
import io
import os
import posixpath
import queue
import re
import stat
import tarfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Optional, Sequence, Union

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.records import Hash, RecordEntry
from installer.utils import parse_entrypoints
from installer.scripts import Script
from installer.sources import WheelFile

from deploy.layer_store import LayerStore
from runtime.digest import Digest
from toolchain.errors import BuildError
from toolchain.image.layers import CHUNK, MTIME, TAR_END, FileLayer, Layer, tar_header, tar_padding
from toolchain.wheels.wheel_checks import MAX_COMPILED, MAX_SCRIPT, check_wheel, record_digests
from toolchain.image.wheel_members import Member

if TYPE_CHECKING:  # named in annotations only; `finish` imports the module where it is used, as before
    from toolchain.image.bytecode import HostCompiler

INSTALLER_NAME = b"raytrain\n"


@dataclass(frozen=True)
class Python:
    """The base image's interpreter, as the venv refers to it."""
    version: str         # full, e.g. 3.11.2 (pyvenv.cfg)
    executable: str      # e.g. /usr/bin/python3 (what bin/python3 points at)
    magic: str = ""      # its .pyc magic number, hex (importlib.util.MAGIC_NUMBER)
    cache_tag: str = ""  # e.g. cpython-311 (the .pyc file names)

    PROBE = ("import sys, importlib.util; "
             "print(sys.version.split()[0], sys.executable, importlib.util.MAGIC_NUMBER.hex(), sys.implementation.cache_tag)")

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @classmethod
    def parse(cls, line: str, what: str) -> "Python":
        """`<version> <executable> <magic> <cache tag>` as the base image printed them (PROBE)."""
        m = re.fullmatch(r"(3\.\d+\.\d+)\S* (/[A-Za-z0-9_./+-]+) ([0-9a-f]{8}) ([a-z]+-\d+)", line.strip())
        if not m:
            raise BuildError("deps", what, f"the base image's Python said {line.strip()!r}; expected "
                             "'<version> <absolute path> <magic> <cache tag>' (is image.python a Python 3 interpreter?)", [])
        return cls(*m.groups())


class _Sink(threading.Thread):
    """Writes blocks to the file and the diff ID's hash on a second core, while the installer inflates
    and hashes the next files (zlib, hashlib and file writes release the GIL)."""

    def __init__(self, f: BinaryIO):
        super().__init__(name="venv-layer-writer", daemon=True)
        self.f, self.hash, self.error = f, hashlib.sha256(), None
        self.blocks: queue.Queue = queue.Queue(maxsize=16)

    def run(self) -> None:
        while (block := self.blocks.get()) is not None:
            if self.error is None:
                try:
                    self.f.write(block)
                    self.hash.update(block)
                except Exception as e:  # a full disk, an engine that stopped reading: said once, by the producer
                    self.error = e

    def put(self, block: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.blocks.put(block)

    def stop(self) -> None:
        if self.is_alive():
            self.blocks.put(None)
            self.join()

    def close(self) -> Digest:
        self.stop()
        if self.error is not None:
            raise self.error
        return Digest.of_hash(self.hash)


class _TarOut:
    """A layer tar being written: small writes gathered into blocks, each block to PUT (a _Sink's, or a list's)."""

    def __init__(self, put: Callable[[bytes], None], progress: Callable[[int], None] = lambda n: None):
        self.put, self.progress = put, progress
        self.pending = bytearray()
        self.size = 0
        self.dirs: set[str] = set()
        self.files: dict[str, tuple[bytes, int]] = {}  # name -> (sha256, size)
        self.wheel = ""
        self.root = ""  # the venv, as tar names start (opt/venv): nothing is written outside it
        self.lib = ""   # the venv's lib/, as tar names start: the modules under it are byte-compiled
        self.modules: list[str] = []           # modules written under lib (their .pyc follow the files)
        self.planned: set[str] = set()         # modules the compiler has from the wheel itself (planned_modules)
        self.unforeseen: dict[str, bytes] = {}  # the source of any other module written under lib
        self.scripts: list[tuple[str, bytes]] = []  # console scripts: written to the top layer instead

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if len(data) >= CHUNK:
            self.flush()
            self.put(data)
            self.progress(self.size)
        else:
            self.pending += data
            if len(self.pending) >= CHUNK:
                self.flush()

    def flush(self) -> None:
        if self.pending:
            self.put(bytes(self.pending))
            self.pending.clear()
            self.progress(self.size)

    def _info(self, name: str, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = MTIME, 0, 0, "", "", mode
        return info

    def parents(self, name: str) -> None:
        for parent in reversed(PurePosixPath(name).parents):
            d = str(parent)
            if d != "." and d not in self.dirs:
                self.dirs.add(d)
                info = self._info(d, 0o755)
                info.type = tarfile.DIRTYPE
                self.write(tar_header(info))

    def directory(self, name: str) -> None:
        self.parents(f"{name}/x")

    def symlink(self, name: str, target: str) -> None:
        self.parents(name)
        info = self._info(name, 0o777)
        info.type, info.linkname = tarfile.SYMTYPE, target
        self.write(tar_header(info))

    def file(self, name: str, stream, size: int, executable: bool, recorded: Optional[bytes] = None) -> tuple[bytes, int]:
        """Copy `size` bytes of stream in, in pieces; returns (sha256 digest of the content, size). RECORDED:
        the sha256 the wheel's RECORD gives for it, checked against the bytes (as installer's
        `validate_record` does); a mismatch refuses the wheel."""
        if name in self.files:  # two wheels of one group layer (or a wheel twice): the same bytes, once
            return self._again(name, stream, size)
        self.parents(name)
        info = self._info(name, 0o755 if executable else 0o644)
        info.size = size
        self.write(tar_header(info))
        digest, left = hashlib.sha256(), size
        module = name.endswith(".py") and name.startswith(self.lib) and size <= MAX_COMPILED
        source = [] if module and name not in self.planned else None
        while left:
            block = stream.read(min(CHUNK, left))
            if not block:
                raise BuildError("deps", name, f"the wheel gave {size - left} of the {size} bytes its archive lists", [])
            digest.update(block)
            self.write(block)
            if source is not None:
                source.append(block)
            left -= len(block)
        if stream.read(1):
            raise BuildError("deps", name, f"the wheel gave more than the {size} bytes its archive lists", [])
        self.write(tar_padding(size))
        sha = digest.digest()
        if recorded is not None and sha != recorded:
            raise BuildError("deps", self.wheel, _altered(self.wheel, name), [])
        if module:
            self.modules.append(name)
        if source is not None:
            self.unforeseen[name] = b"".join(source)
        self.files[name] = (sha, size)
        return sha, size

    def _again(self, name: str, stream, size: int) -> tuple[bytes, int]:
        """A path this layer already holds: the same bytes are not written twice (the engine refuses a path
        twice in one layer); other bytes were refused before any layer was written (`check_conflicts`)."""
        h, n = hashlib.sha256(), 0
        while block := stream.read(CHUNK):
            h.update(block)
            n += len(block)
        digest = h.digest()
        if (digest, n) != self.files[name]:
            raise BuildError("deps", name, f"{self.wheel} installs /{name} with other contents than a wheel before "
                             "it in the same layer; remove one of the two from the requirements", [])
        return digest, size


class _SizedWheel(WheelFile):
    """installer's wheel, its members read by toolchain/image/wheel_members.py (ISA-L's inflate, the size known
    before the bytes): WheelFile.get_contents but for the stream."""

    def get_contents(self):
        # the RECORD read once, checked (record_digests); installer takes only each member's path from its row
        digests = record_digests(self._zipfile, os.path.basename(self._zipfile.filename))
        with open(self._zipfile.filename, "rb") as f:
            for item in self._zipfile.infolist():
                if item.filename.endswith("/"):
                    continue
                mode = item.external_attr >> 16
                executable = bool(mode and stat.S_ISREG(mode) and mode & 0o111)
                stream = Member(f, item, os.path.basename(self._zipfile.filename))
                record = (item.filename, "", "")
                if ".data/scripts/" in item.filename:  # installer seeks in a script to rewrite its #!python
                    if item.file_size > MAX_SCRIPT:
                        raise BuildError("deps", stream.wheel, f"{stream.wheel}: the script {item.filename[:120]!r} "
                                         f"is {item.file_size} bytes (at most {MAX_SCRIPT})", [])
                    data = stream.read()
                    if hashlib.sha256(data).digest() != digests.get(item.filename):
                        raise BuildError("deps", stream.wheel, _altered(stream.wheel, item.filename), [])
                    stream = io.BytesIO(data)
                else:
                    stream.recorded = digests.get(item.filename)
                yield record, stream, executable


def _altered(wheel: str, name: str) -> str:
    return (f"{wheel}: /{name} does not match the sha256 its RECORD gives; the wheel is damaged or altered: "
            "delete it from the wheelhouse and build again")


class _TarDestination(SchemeDictionaryDestination):
    """installer's destination for a venv at `root`, writing into the layer tar instead of a directory."""

    def __init__(self, out: _TarOut, scheme_dict: dict, interpreter: str):
        super().__init__(scheme_dict, interpreter, "posix", bytecode_optimization_levels=())
        self.out = out

    def write_to_fs(self, scheme, path, stream, is_executable: bool) -> RecordEntry:
        name = in_scheme(self.scheme_dict[scheme], path, self.out.wheel)
        size, recorded = getattr(stream, "size", None), getattr(stream, "recorded", None)
        if size is None or scheme == "scripts":  # generated or rewritten (RECORD, a shebang): small
            data = stream.read()
            stream, size, recorded = _Bytes(data), len(data), None
        digest, size = self.out.file(name, stream, size, is_executable, recorded)
        return RecordEntry(path, Hash("sha256", base64.urlsafe_b64encode(digest).decode().rstrip("=")), size)

    def write_script(self, name: str, module: str, attr: str, section) -> RecordEntry:
        """A console script goes to the venv's top layer (`write_top_layer`); its RECORD line stays here."""
        script_name, data = Script(name, module, attr, section).generate(self.interpreter, self.script_kind)
        if not is_script_name(script_name):
            raise BuildError("deps", self.out.wheel, f"{self.out.wheel}: the console script name {script_name[:80]!r} is "
                             "not a plain file name the venv may take (letters, digits, '.', '_', '+', '-'; not "
                             "python*); remove the wheel from the requirements", [])
        self.out.scripts.append((script_name, data))
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        return RecordEntry(script_name, Hash("sha256", digest), len(data))


_SCRIPT_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,199}")
_PYTHON_NAME = re.compile(r"python(3(\.[0-9]+)?)?")  # the top layer's links to the interpreter


def is_script_name(name: str) -> bool:
    """Whether NAME may be a console script in the venv's bin/: one plain file name, not the interpreter's links."""
    return bool(_SCRIPT_NAME.fullmatch(name)) and not _PYTHON_NAME.fullmatch(name)


def in_scheme(scheme_dir: str, path: str, wheel: str) -> str:
    """The tar name of PATH installed into SCHEME_DIR, normalised; a member that climbs out of its scheme's
    directory (`pkg/../../../bin/python3`, `.data/scripts/../lib/x.pth`) refuses the wheel."""
    root = posixpath.normpath(scheme_dir.strip("/"))
    name = posixpath.normpath(posixpath.join(root, path))
    if not name.startswith(root + "/"):
        raise BuildError("deps", wheel, f"{wheel}: the member {path[:120]!r} climbs out of {'/' + root}, where its "
                         "scheme installs; it is not a wheel to trust: remove it from the requirements", [])
    return name


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.pos, self.size = data, 0, len(data)

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        block, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return block


def dist_name(wheel: Path) -> str:
    """The wheel's distribution, normalised (PEP 503): the name two wheels of one project share."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def wheels_of(wheelhouse: Union[Path, Sequence[Path]], minor: str) -> list[Path]:
    """The wheels (a directory's, or the files given) in name order, each checked for the image's Python
    MINOR (toolchain/wheels/wheel_checks.py); two versions of one distribution is an error."""
    wheels = sorted(wheelhouse.glob("*.whl") if isinstance(wheelhouse, Path) else wheelhouse, key=lambda w: w.name)
    seen: dict[str, Path] = {}
    for w in wheels:
        check_wheel(w, minor)
        dist = dist_name(w)
        if dist in seen:
            where = wheelhouse if isinstance(wheelhouse, Path) else w.parent
            raise BuildError("deps", str(where), f"two wheels of {dist}: {seen[dist].name} and {w.name}; "
                             f"delete {where} and build again to download the wheel set afresh", [])
        seen[dist] = w
    return wheels


def _schemes(python: Python, venv: str) -> dict[str, str]:
    """Where installer puts each scheme of a wheel in the venv (headers: one more level, the distribution)."""
    site = f"{venv}/lib/python{python.minor}/site-packages"
    return {"purelib": site, "platlib": site, "scripts": f"{venv}/bin", "data": venv,
            "headers": f"{venv}/include/site/python{python.minor}"}


def _installed(wheel: Path, python: Python, venv: str) -> Iterator[tuple[zipfile.ZipInfo, str]]:
    """(member, tar name) of each file the wheel installs, from the zip's directory alone, as installer
    places members: in site-packages, or by the scheme of their <dist>-<version>.data directory."""
    to = {scheme: path.lstrip("/") for scheme, path in _schemes(python, venv).items()}
    dist, version = wheel.name.split("-")[:2]
    data_dir = f"{dist}-{version}.data/"
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            m = info.filename
            if m.endswith("/"):
                continue
            scheme, _, rest = m[len(data_dir):].partition("/") if m.startswith(data_dir) else ("purelib", "", m)
            if scheme not in to:
                raise BuildError("deps", wheel.name, f"{wheel.name}: the member {m[:120]!r} is in no scheme installer "
                                 f"knows ({', '.join(sorted(to))}); remove the wheel from the requirements", [])
            yield info, in_scheme(to[scheme], rest, wheel.name)


def planned_modules(wheels: list[Path], python: Python, venv: str) -> list[tuple[Path, list[tuple[str, str]]]]:
    """For each wheel, (member, tar name) of the modules it will put under the venv's lib/ (what
    `compileall <venv>/lib` compiles), from the zip's directory alone."""
    lib = f"{venv.strip('/')}/lib/"
    return [(w, [(info.filename, name) for info, name in _installed(w, python, venv)
                 if name.endswith(".py") and name.startswith(lib) and info.file_size <= MAX_COMPILED]) for w in wheels]


def check_conflicts(wheels: list[Path], python: Python, venv: str) -> None:
    """Refuse two wheels that install one path with different contents (told apart by the sha256 each
    one's RECORD gives, which every member's bytes are checked against as they are written), naming both:
    pip would keep whichever it installed last, and in layers the upper one would hide the other. The
    same bytes (every nvidia-* wheel's nvidia/__init__.py) are fine: each wheel's layer holds its own
    copy, so a wheel's layer depends on that wheel alone. A console script (written to the venv's top
    layer) may not share its path with another wheel's console script or with any wheel's file."""
    seen: dict[str, tuple[Optional[bytes], str]] = {}
    scripts: dict[str, str] = {}  # tar name -> the wheel whose console script it is
    bin_dir = f"{venv.strip('/')}/bin/"
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            digests = record_digests(z, w.name)
        for name in console_scripts(w):
            path = bin_dir + name
            first = scripts.setdefault(path, w.name)
            if first != w.name:
                raise BuildError("deps", path, _both(first, w.name, path, "as console scripts"), [])
        for info, name in _installed(w, python, venv):
            if "dist-info/" in name:
                continue
            first = seen.setdefault(name, (digests.get(info.filename), w.name))
            if first[0] != digests.get(info.filename):
                raise BuildError("deps", name, _both(first[1], w.name, name, "with different contents"), [])
    for path, owner in scripts.items():
        if path in seen:
            raise BuildError("deps", path, _both(seen[path][1], owner, path, "(a file, and a console script over it)"),
                             [])


def _both(first: str, second: str, path: str, how: str) -> str:
    return (f"{first} and {second} both install /{path}, {how}; pip would keep whichever it installed last. "
            "Remove one of the two from the requirements, or pin versions that agree")


def console_scripts(wheel: Path) -> list[str]:
    """The console and GUI script names the wheel's entry_points.txt declares (installer's parser)."""
    dist, version = wheel.name.split("-")[:2]
    with zipfile.ZipFile(wheel) as z:
        try:
            text = z.read(f"{dist}-{version}.dist-info/entry_points.txt")
        except KeyError:
            return []
    try:
        return [name for name, _module, _attr, _section in parse_entrypoints(text.decode("utf-8", "replace"))]
    except (AssertionError, ValueError, configparser.Error) as e:
        raise BuildError("deps", wheel.name, f"{wheel.name}: its entry_points.txt cannot be read ({type(e).__name__}); "
                         "remove the wheel from the requirements", []) from None


class LayerWriter:
    """One dependency layer (a wheel, or a group of small wheels: toolchain/image/venv_plan.py) written to
    STORE/<diff id hex>.tar in two steps, so the writer goes on to the next layer while this one's
    bytecode is still being compiled: `files()` installs the wheels into the tar, `finish(compiler)` appends
    the .pyc of the modules written (toolchain/image/bytecode.py `HostCompiler`) sorted by name, ends the tar
    and names it by its sha256. Only a finished
    layer is in the store; `abort()` removes the partial file."""

    def __init__(self, wheels: list[Path], python: Python, venv: str, store: LayerStore | Path, planned: set[str] = frozenset(),
                 progress: Optional[Callable[[int], None]] = None):
        self.wheels, self.python, self.venv, self.store = wheels, python, venv, LayerStore.of(store)
        self.tmp = self.store.partial(f"layer.{threading.get_ident()}.{wheels[0].name}")
        self.f = open(self.tmp, "wb")
        self.sink = _Sink(self.f)
        self.sink.start()
        self.out = _TarOut(self.sink.put, progress or (lambda n: None))
        self.out.root = venv.strip("/")
        self.out.lib = f"{self.out.root}/lib/"
        self.out.planned = set(planned)

    def files(self) -> "LayerWriter":
        schemes = _schemes(self.python, self.venv)
        for wheel in self.wheels:
            self.out.wheel = wheel.name
            try:
                with _SizedWheel.open(wheel) as source:
                    headers = dict(schemes, headers=f"{schemes['headers']}/{source.distribution}")
                    install(source, _TarDestination(self.out, headers, f"{self.venv}/bin/python"),
                            additional_metadata={"INSTALLER": INSTALLER_NAME})
            except BuildError:
                raise
            except Exception as e:  # installer's own validation (a broken RECORD, a bad .data dir), a bad zip
                raise BuildError("deps", wheel.name, f"the wheel could not be installed: {e}", []) from None
        return self

    def finish(self, compiler: Optional[HostCompiler], cache_tag: str = "") -> FileLayer:
        """COMPILER None: no bytecode in this layer (the base's Python compiles it: toolchain/image/bytecode.py);
        else the .pyc of this layer's modules, the planned ones from its workers and those the plan did not
        foresee compiled by it now (`HostCompiler.compile`, the same bytes)."""
        from toolchain.image.bytecode import pyc_name
        pyc: dict[str, Optional[bytes]] = {}
        if compiler is None:
            self.out.modules.clear()
        else:
            pyc = compiler.of(self.wheels)
            if self.out.unforeseen:
                pyc.update(compiler.compile(sorted(self.out.unforeseen.items())))
        for name in sorted(self.out.modules):
            data = pyc.get(name)
            if data is not None:
                self.out.file(pyc_name(name, cache_tag), _Bytes(data), len(data), False)
        self.out.write(TAR_END)
        self.out.flush()
        diff_id = self.sink.close()
        self.f.close()
        path = self.store.put_tar(self.tmp, diff_id)
        return FileLayer(path, diff_id, self.out.size)

    def abort(self) -> None:
        self.sink.stop()
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def top_layer(python: Python, venv: str, scripts: list[tuple[str, bytes]]) -> Layer:
    """What all the wheels share, as one small layer above theirs: the venv's directories, bin/python3 ->
    the base's interpreter (bin/python and bin/python3.X -> python3, lib64 -> lib), pyvenv.cfg as
    `python -m venv` writes it, and the wheels' console scripts (`#!/opt/venv/bin/python`), by name.
    Two wheels' scripts of one name with other contents are refused, naming the script."""
    blocks: list[bytes] = []
    out = _TarOut(blocks.append)
    out.root = venv.strip("/")
    v = out.root
    for d in ("bin", "include", f"lib/python{python.minor}/site-packages"):
        out.directory(f"{v}/{d}")
    out.symlink(f"{v}/bin/python3", python.executable)
    out.symlink(f"{v}/bin/python", "python3")
    out.symlink(f"{v}/bin/python{python.minor}", "python3")
    out.symlink(f"{v}/lib64", "lib")
    cfg = (f"home = {os.path.dirname(python.executable)}\ninclude-system-site-packages = false\n"
           f"version = {python.version}\nexecutable = {python.executable}\n"
           f"command = {python.executable} -m venv {venv}\n").encode()
    out.file(f"{v}/pyvenv.cfg", _Bytes(cfg), len(cfg), False)
    chosen: dict[str, bytes] = {}
    for name, data in scripts:
        if chosen.setdefault(name, data) != data:
            raise BuildError("deps", name, f"two wheels install the console script bin/{name} with different "
                             "contents; remove one of the two from the requirements", [])
    for name in sorted(chosen):
        out.file(f"{v}/bin/{name}", _Bytes(chosen[name]), len(chosen[name]), True)
    out.write(TAR_END)
    out.flush()
    return Layer(b"".join(blocks))

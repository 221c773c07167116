"""A wheel checked before any of its bytes go into a layer, as pip and PyPA's `installer` check one.

Each check ends the build with one line naming the wheel's file, and runs before anything is written:
  - the file: a regular file (not a device or a FIFO behind a link) that is a zip archive;
  - the name: a valid wheel file name (`packaging.utils.parse_wheel_filename`), with a tag the
    image's Python and platform take (`supported_tags`: CPython of the base's minor version on the
    wheelhouse's PLATFORMS, as `pip download --python-version --platform` chose them);
  - the archive: members bounded (MAX_MEMBER each, MAX_UNPACKED in all, and no member of BOMB_MIN
    or more that inflates over BOMB_RATIO times its compressed size: a real library is 2-10x, the
    most in the example's 56 wheels is a 2 MB .so at 224x), no two members' data overlapping
    (CPython 3.12's zipfile refuses that too; 3.11's does not), no member name twice, none absolute
    or with a backslash, a NUL or `..` climbing out of the archive;
  - RECORD, as installer's `validate_record` reads it (`record_digests`, the one reader): one
    RECORD of at most MAX_RECORD bytes, every row three values with a path, every member but the
    RECORD itself listed with a sha256 and, where a size is given, the member's size; every path it
    lists is a member (a RECORD that names another wheel's file is refused). Each member's bytes are
    checked against that sha256 as the member is written (toolchain/image/venv_layer.py).
Where a member lands in the venv (inside its scheme's directory, by its normalised name) is checked
by toolchain/image/venv_layer.py, which knows the schemes.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import zipfile
from functools import lru_cache
from pathlib import Path, PurePosixPath

from installer.records import InvalidRecordEntry, parse_record_file
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from toolchain.errors import BuildError

GLIBC_MINOR = 36  # the base's glibc (Debian bookworm's 2.36): no wheel may need a newer one
# pip download's --platform list (pip takes older glibcs and their legacy aliases from each)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(GLIBC_MINOR, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
MAX_MEMBER = 4 << 30      # libtorch_cuda.so is 1.0 GiB
MAX_UNPACKED = 16 << 30   # torch's wheel unpacks to 1.7 GiB
BOMB_MIN = 64 << 20
BOMB_RATIO = 200
MAX_SCRIPT = 16 << 20     # a .data/scripts member: its #! line is rewritten in memory
MAX_RECORD = 64 << 20     # a wheel's RECORD (torch's: 1.6 MB, for 16,000 files)
MAX_COMPILED = 16 << 20   # a module this big gets no .pyc (it compiles at import); the biggest real one here: 1.2 MB
_LOCAL_HEADER = 30        # a zip local header's fixed part
# what pip takes for each --platform given: manylinux_2_N also takes every older glibc and its legacy aliases
_TAG_PLATFORMS = ([f"manylinux_2_{n}_x86_64" for n in range(GLIBC_MINOR, 4, -1)]
                  + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])


def _refuse(wheel: Path, why: str) -> BuildError:
    return BuildError("deps", wheel.name, f"{wheel.name}: {why}; remove it from the requirements or delete it from the "
                      "wheelhouse and build again", [])


@lru_cache(maxsize=8)
def supported_tag_order(minor: str) -> dict[Tag, int]:
    """The tags a wheel for CPython MINOR ("3.11") on the wheelhouse's platforms may carry, each with its
    rank: 0 is the most specific, the one pip prefers among the wheels of one release."""
    try:
        version = tuple(int(p) for p in minor.split("."))
    except ValueError:
        raise BuildError("deps", minor, f"the image's Python version {minor!r} is not MAJOR.MINOR", []) from None
    order: dict[Tag, int] = {}
    for tag in [*cpython_tags(version, platforms=_TAG_PLATFORMS),
                *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms=_TAG_PLATFORMS)]:
        order.setdefault(tag, len(order))
    return order


def supported_tags(minor: str) -> frozenset[Tag]:
    """The tags a wheel for CPython MINOR ("3.11") on the wheelhouse's platforms may carry."""
    return frozenset(supported_tag_order(minor))


def check_wheel(wheel: Path, minor: str) -> None:
    """Refuse WHEEL for the image's Python MINOR unless every check above passes."""
    try:
        st = os.stat(wheel)
    except OSError as e:
        raise _refuse(wheel, f"cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(wheel, "is not a regular file")
    try:
        _, _, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as e:
        raise _refuse(wheel, f"is not a valid wheel file name ({str(e)[:120]})") from None
    if not tags & supported_tags(minor):
        raise _refuse(wheel, f"is built for {', '.join(sorted(str(t) for t in tags))[:160]}, not for CPython {minor} on "
                      "Linux x86_64")
    try:
        with zipfile.ZipFile(wheel) as z:
            infos, start_dir = z.infolist(), z.start_dir
            _check_members(wheel, infos, start_dir)
            record_digests(z, wheel.name)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise _refuse(wheel, f"is not a zip archive that can be read ({type(e).__name__})") from None


def _check_members(wheel: Path, infos: list[zipfile.ZipInfo], start_dir: int) -> None:
    seen: set[str] = set()
    total = 0
    for i in infos:
        name = i.filename
        parts = PurePosixPath(name).parts
        if (not name or name.startswith("/") or "\\" in name or "\x00" in name
                or ".." in parts or (parts and parts[0].endswith(":"))):
            raise _refuse(wheel, f"has a member named {name[:120]!r}, outside the archive")
        if name in seen:
            raise _refuse(wheel, f"has the member {name[:120]!r} twice")
        seen.add(name)
        if i.file_size > MAX_MEMBER:
            raise _refuse(wheel, f"its member {name[:120]!r} unpacks to {i.file_size} bytes (at most {MAX_MEMBER})")
        if i.file_size >= BOMB_MIN and i.file_size > BOMB_RATIO * max(i.compress_size, 1):
            raise _refuse(wheel, f"its member {name[:120]!r} inflates {i.file_size // max(i.compress_size, 1)} times "
                          f"(a zip bomb; at most {BOMB_RATIO} for a member of {BOMB_MIN >> 20} MiB or more)")
        total += i.file_size
    if total > MAX_UNPACKED:
        raise _refuse(wheel, f"unpacks to {total} bytes (at most {MAX_UNPACKED})")
    spans = sorted((i.header_offset, i.header_offset + _LOCAL_HEADER + len(i.orig_filename.encode("utf-8", "replace"))
                    + i.compress_size, i.filename) for i in infos)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if end > start:
            raise _refuse(wheel, f"the data of its members {name[:80]!r} and {other[:80]!r} overlap")
    if spans and spans[-1][1] > start_dir:
        raise _refuse(wheel, f"the data of its member {spans[-1][2][:120]!r} runs into the archive's directory")


_SHA256_B64 = re.compile(r"[A-Za-z0-9_-]{43}")
_SIGNATURES = ("RECORD.jws", "RECORD.p7s")  # beside RECORD, unlisted by design (PEP 376)


def record_digests(z: zipfile.ZipFile, wheel: str) -> dict[str, bytes]:
    """Each member's sha256 (raw bytes) as the wheel's RECORD gives it, every row checked as installer's
    validate_record checks it; a RECORD that fails refuses the wheel, in one line naming it."""
    infos = z.infolist()
    records = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise _refuse(Path(wheel), f"has {len(records)} .dist-info/RECORD files; a wheel has one")
    record = records[0]
    if record.file_size > MAX_RECORD:
        raise _refuse(Path(wheel), f"its RECORD is {record.file_size} bytes (at most {MAX_RECORD})")
    text = z.read(record).decode("utf-8", "replace")
    rows: dict[str, tuple[str, str]] = {}
    try:
        for path, hash_, size in parse_record_file(text.splitlines()):
            if not path:
                raise _refuse(Path(wheel), "its RECORD has a row without a path")
            rows[path] = (hash_, size)
    except InvalidRecordEntry as e:
        raise _refuse(Path(wheel), f"its RECORD has a malformed row ({'; '.join(e.issues)[:160]})") from None
    members = {i.filename: i for i in infos if not i.filename.endswith("/")}
    strays = sorted(p for p in rows if p not in members)
    if strays:
        raise _refuse(Path(wheel), f"its RECORD lists {strays[0][:120]!r}, which the wheel does not contain")
    dist_info = record.filename.rpartition("/")[0]
    unlisted = {record.filename, *(f"{dist_info}/{name}" for name in _SIGNATURES)}
    digests: dict[str, bytes] = {}
    for name, info in members.items():
        if name in unlisted:
            continue
        hash_, size = rows.get(name, ("", ""))
        algorithm, _, value = hash_.partition("=")
        if not hash_:
            raise _refuse(Path(wheel), f"its RECORD gives no hash for {name[:120]!r}; every file but RECORD has one")
        if algorithm != "sha256" or not _SHA256_B64.fullmatch(value):
            raise _refuse(Path(wheel), f"its RECORD gives {name[:120]!r} the hash {hash_[:80]!r}, not a sha256 "
                          "(sha256=<43 characters of urlsafe base64>)")
        if size and (not size.isdigit() or int(size) != info.file_size):
            raise _refuse(Path(wheel), f"its RECORD gives {name[:120]!r} the size {size[:40]!r}; the archive holds "
                          f"{info.file_size} bytes")
        try:
            digests[name] = base64.urlsafe_b64decode(value + "=")
        except (binascii.Error, ValueError):
            raise _refuse(Path(wheel), f"its RECORD's hash for {name[:120]!r} is not base64") from None
    return digests

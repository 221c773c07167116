"""A requirement set resolved for the image, by uv, and the wheels the pool already has for it.

uv resolves the set as the image installs it: for CPython MINOR on x86_64 Linux with the base's
glibc, sdists included. pip, asked for wheels only (`--only-binary :all:`, which a download for
another platform needs), steps back without a word to older releases when a dependency is published
only as an sdist: hydra-core 1.3 needs antlr4-python3-runtime 4.9.3, an sdist, and pip chose
hydra-core 0.11.3, of 2019. Here the newest release that fits stays chosen, and the wheelhouse builds
the sdist's wheel, kept only when it is pure Python (toolchain/wheels/wheelhouse.py).

uv's cache is the user cache's `uv/` (toolchain/cache.py); a resolution that finds its metadata
there takes well under a second (the example's 56 packages: 0.3 s). uv writes it as a PEP 751 lock
(pylock.toml), which lists each pin's wheels for the image's platform with their URLs, sizes and
sha256: those the pool holds are taken from it, and only the others are downloaded, from those URLs
(toolchain/wheels/download.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from toolchain import cache
from toolchain.wheels import pool_page
from toolchain.wheels.download import WheelFile
from toolchain.wheels.requirements import uv_binary
from toolchain.wheels.wheel_checks import GLIBC_MINOR, supported_tag_order

RESOLVE_TIMEOUT_S = 600  # a cold resolution fetches each package's metadata over the network
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
WHEEL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\.whl")  # a pool's file name: a wheel's, no path in it


class ResolveError(Exception):
    """uv is missing, or could not resolve the set (the message says why, in one line)."""


@dataclass(frozen=True)
class Pin:
    name: str      # canonical (PEP 503)
    version: Version
    # the wheels the lock lists for the image's platform, from an index (http or https), most specific
    # tag first; not part of the pin's identity
    wheels: tuple[WheelFile, ...] = field(default=(), compare=False, hash=False)

    @property
    def text(self) -> str:
        return f"{self.name}=={self.version}"


def platform() -> str:
    """The image's platform as uv names it."""
    return f"x86_64-manylinux_2_{GLIBC_MINOR}"


def resolve(requirements: list[str], minor: str, find_links: Path) -> list[Pin]:
    """The pins of REQUIREMENTS (pip's requirement lines) for CPython MINOR on the image's platform, each
    package once; FIND_LINKS (the pool, given to uv as its page of links) is searched beside the index, so a
    wheel already downloaded from another index (a CPU torch) or built here from an sdist is found. The
    index is pip's, when PIP_INDEX_URL or PIP_EXTRA_INDEX_URL say so (uv reads its own UV_* settings as well)."""
    uv = uv_binary()
    if uv is None:
        raise ResolveError("uv is not installed (`pip install uv`)")
    cmd = [uv, "pip", "compile", "-", "--python-version", minor, "--python-platform", platform(), "--no-header",
           "--format", "pylock.toml", "--quiet", "--cache-dir", str(cache.writable(cache.UV))]
    for var, flag in (("PIP_INDEX_URL", "--index-url"), ("PIP_EXTRA_INDEX_URL", "--extra-index-url")):
        for url in os.environ.get(var, "").split():
            cmd += [flag, url]
    try:
        with tempfile.TemporaryDirectory(prefix="raytrain-pool-page-") as tmp:
            if find_links.is_dir():  # the pool by its page: uv hashes no wheel (toolchain/wheels/pool_page.py)
                cmd += ["--find-links", str(pool_page.page(find_links, Path(tmp) / "pool.html"))]
            res = subprocess.run(cmd, input="\n".join(requirements) + "\n", capture_output=True, text=True,
                                 timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ResolveError(f"uv did not finish resolving in {RESOLVE_TIMEOUT_S} s") from None
    except OSError as e:
        raise ResolveError(f"uv could not be run ({e.strerror or e})") from None
    if res.returncode != 0:
        lines = [l.strip() for l in res.stderr.splitlines() if l.strip()]
        raise ResolveError(f"uv could not resolve the set: {' '.join(lines[-6:])[:600] or 'no output'}")
    try:
        doc = tomllib.loads(res.stdout)
    except tomllib.TOMLDecodeError as e:
        raise ResolveError(f"uv's resolution is not a pylock.toml ({e})") from None
    return parse_lock(doc, minor)


def parse_lock(doc: dict, minor: str) -> list[Pin]:
    """The pins of uv's pylock.toml DOC, each package once, each with its index wheels the image takes;
    anything else is a ResolveError naming the entry."""
    pins: dict[str, Pin] = {}
    packages = doc.get("packages")
    if not isinstance(packages, list):
        raise ResolveError("uv's resolution has no [[packages]]")
    order = supported_tag_order(minor)
    for entry in packages:
        shown = repr(entry)[:200]
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("version"), str):
            raise ResolveError(f"uv's resolution has a package without a name and a version: {shown}")
        try:
            name, version = canonicalize_name(entry["name"]), Version(entry["version"])
        except InvalidVersion:
            raise ResolveError(f"uv's resolution has a version that is not one: {shown}") from None
        if name in pins and pins[name].version != version:
            raise ResolveError(f"uv's resolution names {name} twice ({pins[name].version} and {version})")
        pins[name] = Pin(name, version, _index_wheels(entry.get("wheels"), name, version, order))
    if not pins:
        raise ResolveError("uv's resolution is empty")
    return list(pins.values())


def _index_wheels(listed, name: str, version: Version, order: dict) -> tuple[WheelFile, ...]:
    """The wheels of a lock entry that can be fetched and checked: from an http(s) URL, with a sha256, named
    as this pin's, with a tag the image takes; most specific tag first. Others (a file:// wheel of the
    pool, a wheel for another platform) are left out."""
    ranked = []
    for w in listed if isinstance(listed, list) else []:
        url = w.get("url") if isinstance(w, dict) else None
        sha256 = (w.get("hashes") or {}).get("sha256") if isinstance(w, dict) else None
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not isinstance(sha256, str):
            continue
        file = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        if not WHEEL_FILE.fullmatch(file):  # the pool's file is named by it: no "%2F..%2F" past the pool
            continue
        try:
            w_name, w_version, _, tags = parse_wheel_filename(file)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        rank = min((order[t] for t in tags if t in order), default=None)
        size = w.get("size")
        if (w_name, w_version) != (name, version) or rank is None or not _SHA256.fullmatch(sha256):
            continue
        ranked.append((rank, file, WheelFile(file, url, sha256.lower(), size if isinstance(size, int) else None)))
    return tuple(wf for _, _, wf in sorted(ranked, key=lambda r: r[:2]))


def in_pool(pins: list[Pin], pool: Path, minor: str) -> dict[Pin, str]:
    """The pool's wheel for each pin it has one for: the pin's name and version, a tag the image takes, the
    most specific such tag first (as pip chooses among the wheels of one release)."""
    order = supported_tag_order(minor)
    wanted = {(p.name, p.version): p for p in pins}
    best: dict[Pin, tuple[int, str]] = {}
    try:
        entries = list(os.scandir(pool))
    except OSError:
        return {}
    for e in entries:
        if not e.name.endswith(".whl") or not e.is_file(follow_symlinks=False):
            continue
        try:
            name, version, _, tags = parse_wheel_filename(e.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        pin = wanted.get((name, version))
        rank: Optional[int] = min((order[t] for t in tags if t in order), default=None)
        if pin is None or rank is None:
            continue
        if pin not in best or (rank, e.name) < best[pin]:
            best[pin] = (rank, e.name)
    return {pin: name for pin, (_, name) in best.items()}

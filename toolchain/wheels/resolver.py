"""A requirement set resolved for the image, by uv, and the wheels the pool already has for it.

uv resolves the set as the image installs it: for CPython MINOR on x86_64 Linux with the base's
glibc, sdists included. pip, asked for wheels only (`--only-binary :all:`, which a download for
another platform needs), steps back without a word to older releases when a dependency is published
only as an sdist: hydra-core 1.3 needs antlr4-python3-runtime 4.9.3, an sdist, and pip chose
hydra-core 0.11.3, of 2019. Here the newest release that fits stays chosen, and the wheelhouse builds
the sdist's wheel, kept only when it is pure Python (toolchain/wheels/wheelhouse.py).

uv's cache is the user cache's `uv/` (toolchain/cache.py); a resolution that finds its metadata
there takes well under a second (the example's 56 packages: 0.3 s). The pins then name the wheels:
those the pool holds are taken from it, and only the others are downloaded.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from toolchain import cache
from toolchain.wheels.requirements import uv_binary
from toolchain.wheels.wheel_checks import GLIBC_MINOR, supported_tag_order

RESOLVE_TIMEOUT_S = 600  # a cold resolution fetches each package's metadata over the network
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


class ResolveError(Exception):
    """uv is missing, or could not resolve the set (the message says why, in one line)."""


@dataclass(frozen=True)
class Pin:
    name: str      # canonical (PEP 503)
    version: Version

    @property
    def text(self) -> str:
        return f"{self.name}=={self.version}"


def platform() -> str:
    """The image's platform as uv names it."""
    return f"x86_64-manylinux_2_{GLIBC_MINOR}"


def resolve(requirements: list[str], minor: str, find_links: Path) -> list[Pin]:
    """The pins of REQUIREMENTS (pip's requirement lines) for CPython MINOR on the image's platform, each
    package once; FIND_LINKS (the pool) is searched beside the index, so a wheel already downloaded from
    another index (a CPU torch) is found. The index is pip's, when PIP_INDEX_URL or PIP_EXTRA_INDEX_URL
    say so (uv reads its own UV_* settings as well)."""
    uv = uv_binary()
    if uv is None:
        raise ResolveError("uv is not installed (`pip install uv`)")
    cmd = [uv, "pip", "compile", "-", "--python-version", minor, "--python-platform", platform(), "--no-header",
           "--no-annotate", "--quiet", "--cache-dir", str(cache.writable(cache.UV))]
    if find_links.is_dir():
        cmd += ["--find-links", str(find_links)]
    for var, flag in (("PIP_INDEX_URL", "--index-url"), ("PIP_EXTRA_INDEX_URL", "--extra-index-url")):
        for url in os.environ.get(var, "").split():
            cmd += [flag, url]
    try:
        res = subprocess.run(cmd, input="\n".join(requirements) + "\n", capture_output=True, text=True,
                             timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ResolveError(f"uv did not finish resolving in {RESOLVE_TIMEOUT_S} s") from None
    except OSError as e:
        raise ResolveError(f"uv could not be run ({e.strerror or e})") from None
    if res.returncode != 0:
        lines = [l.strip() for l in res.stderr.splitlines() if l.strip()]
        raise ResolveError(f"uv could not resolve the set: {' '.join(lines[-6:])[:600] or 'no output'}")
    return parse_pins(res.stdout)


def parse_pins(text: str) -> list[Pin]:
    """uv's `name==version` lines, each package once; anything else is a ResolveError naming the line."""
    pins: dict[str, Pin] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _PIN.fullmatch(line)
        if not m:
            raise ResolveError(f"uv's resolution has a line that is not name==version: {line[:200]!r}")
        try:
            pin = Pin(canonicalize_name(m.group(1)), Version(m.group(2)))
        except InvalidVersion:
            raise ResolveError(f"uv's resolution has a version that is not one: {line[:200]!r}") from None
        if pins.get(pin.name, pin) != pin:
            raise ResolveError(f"uv's resolution names {pin.name} twice ({pins[pin.name].version} and {pin.version})")
        pins[pin.name] = pin
    if not pins:
        raise ResolveError("uv's resolution is empty")
    return list(pins.values())


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

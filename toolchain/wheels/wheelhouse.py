"""Host-side wheelhouse: the project's requirement set resolved by uv and downloaded, for the image's Python.

The image build never touches the network: the dependency layers are written from these wheels
(toolchain/image/deps_stage.py). Both halves live in the user's cache (toolchain/cache.py), shared by every
project as pip's cache is:
  - the pool, `wheels/`: every wheel once;
  - the sets, `wheel-sets/<set key>/`: what one requirement set (for one Python, one torch) resolved to,
    a manifest (each wheel's name, size and sha256) and `requirements.lock` (every wheel pinned by name,
    version and hash).
A new set downloads only the wheels the pool lacks, from the URLs uv's lock gives, each checked against
its sha256 (toolchain/wheels/download.py; pip for what the lock gives no wheel of). A set is reused, by
this project or another with the same requirements, as long as its wheels are in the pool, with no
resolution and no network; an unpinned requirement therefore stays as it first resolved until the
requirements change (pin them to choose). The pool is
bounded (RAYTRAIN_WHEELS_MAX_GB, default 40): after a download the wheels used longest ago go first,
never one of the set just made. The requirements themselves are read by toolchain/wheels/requirements.py.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from runtime import numbers
from runtime.errors import InputError
from runtime.files import read_regular
from toolchain import cache
from toolchain.wheels import download, pool_page, requirements, resolver
from toolchain.atomic import write_atomic
from toolchain.publish.blobs import file_sha256
from toolchain.config import Settings, TorchSettings
from toolchain.errors import ConfigError, WheelhouseError
from toolchain.hashing import key_of
from toolchain.progress import Reporter, human_bytes
from toolchain.wheels.requirements import Requirement
from toolchain.wheels.wheel_checks import PLATFORMS  # the image's interpreter and glibc, not the host's
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "manifest.json"
LOCK = "requirements.lock"
VERIFIED = "verified.json"
USED = ".used"  # in the pool: an empty marker per wheel, its mtime the wheel's last use
MAX_POOL_ENV = "RAYTRAIN_WHEELS_MAX_GB"
MAX_POOL_GB = 40
# pip download's line for each file of the resolved set: fetched now, or found in the download directory
_PIP_FILE = re.compile(r"\s*(?:Saved|File was already downloaded) (.+\.whl)\s*")


class _Manifest(BaseModel):
    """A wheel set's manifest.json as _fill writes it; anything else is a damaged set, filled again."""
    model_config = ConfigDict(extra="forbid", strict=True)
    key: str = Field(..., pattern=r"^[0-9a-f]{16,64}$")
    requirements: list[str] = Field(..., max_length=10_000)
    wheels: list[str] = Field(..., min_length=1, max_length=10_000)
    size: int = Field(..., ge=0)
    sha256: list[str] = Field(..., max_length=10_000)


class _Verified(BaseModel):
    """verified.json beside a set's manifest: each wheel's (size, inode, mtime ns, ctime ns) when its bytes were
    last hashed and found to be the manifest's. A wheel whose stat differs is hashed again (a rewrite, even
    of equal size and mtime, moves its ctime, which no user can set)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    wheels: dict[str, tuple[int, int, int, int]] = Field(..., max_length=10_000)


class _TorchChoice(BaseModel):
    """The torch memo: which requirement and source were chosen (never an option: checked on reading)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    requirement: str
    source: str


def _own_json(path: Path, model: type[BaseModel]) -> Optional[BaseModel]:
    """A JSON file this toolchain wrote, parsed as MODEL; None when it is missing, a link or not a regular
    file, too big, or damaged (the caller then makes it again)."""
    try:
        return model.model_validate_json(read_regular(path, 1 << 20, follow=False))
    except (OSError, ValueError, ValidationError, RecursionError):
        return None


@dataclass
class Wheelhouse:
    path: Path          # the set's directory (manifest and lock)
    key: str
    requirements: list[str]
    wheels: list[str]   # file names, in the pool
    size: int
    torch_source: str
    sha256: tuple = ()  # each wheel's sha256 hex, in the order of `wheels`
    pool: Optional[Path] = None  # where the wheels are (None: in PATH itself)

    @property
    def files(self) -> list[Path]:
        """The set's wheel files."""
        where = self.pool or self.path
        return [where / w for w in self.wheels]


def project_requirements(settings: Settings) -> tuple[list[Requirement], list[Requirement]]:
    """(the runtime's requirements, the project's), each source read once (toolchain/wheels/requirements.py)."""
    own = settings.runtime_dir / "requirements.txt"
    if not own.is_file():
        raise ConfigError(f"project.runtime_dir: {settings.runtime_dir} has no requirements.txt, so it is not the "
                          "runtime package; point it at one, or leave it empty for the runtime installed with the tool")
    runtime = requirements.read(own, "the runtime's requirements.txt")
    user: list[Requirement] = []
    for rel in settings.project.requirements:
        user += requirements.read(settings.path(rel), rel)
    return runtime, user


def requirements_key(settings: Settings) -> list:
    """What the requirement set depends on, before a Python or a torch is chosen (the held cluster's check)."""
    runtime, user = project_requirements(settings)
    return [r.key() for r in runtime + user]


def pool_bound() -> int:
    """The pool's bound in bytes (RAYTRAIN_WHEELS_MAX_GB)."""
    given = os.environ.get(MAX_POOL_ENV)
    if not given:
        return MAX_POOL_GB << 30
    try:
        return numbers.whole(given, MAX_POOL_ENV, 1, 1 << 20) << 30
    except InputError as e:
        raise ConfigError(str(e)) from None


def _pip_download(dest: Path, reqs: list[str], python_version: str, extra: list[str]) -> subprocess.CompletedProcess:
    """pip download of REQS into DEST for the image's CPython and platforms (wheels only)."""
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
           "-d", str(dest), "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return subprocess.run(cmd + extra + reqs, capture_output=True, text=True)


DEFAULT_SOURCES = ("default index", "default index (fallback)")  # torch from pip's index, not image.torch's


def pool_dir() -> Path:
    """The user cache's wheel pool (every project's wheels, each file once)."""
    return cache.writable(cache.WHEELS)


def choose_torch(settings: Settings, variant: str, python_version: str, rep: Reporter,
                 known_source: Optional[str] = None) -> tuple[str, str]:
    """(requirement, source) for torch in a variant; the choice is remembered so re-runs work offline.
    KNOWN_SOURCE: the source a previous image of the variant was made with (its label), taken when it is
    one of the two choices and nothing is remembered here: a fresh runner does not download torch to look."""
    torch: TorchSettings = settings.image.torch[variant]
    if not torch.index_url:
        return torch.requirement, "default index"
    wanted = torch.index_requirement or torch.requirement
    memo = cache.writable(cache.WHEEL_SETS) / f"torch-{key_of(python_version, torch.model_dump())[:16]}.json"
    known = {(wanted, torch.index_url), (torch.requirement, "default index (fallback)")}  # the only two choices
    remembered = _own_json(memo, _TorchChoice)
    if remembered is not None and (remembered.requirement, remembered.source) in known:
        return remembered.requirement, remembered.source
    if remembered is None:
        for requirement, source in known:
            if source == known_source:
                write_atomic(memo, json.dumps({"requirement": requirement, "source": source}))
                return requirement, source
    if os.path.lexists(memo):
        rep.warn(f"wheelhouse[{variant}]: {memo} is not a torch choice this tool wrote (damaged, or another "
                 "choice); it is made again")
    rep.step(f"wheelhouse[{variant}]: looking for {wanted} on {torch.index_url}")
    pool = cache.writable(cache.WHEELS)  # what the look downloads is the wheel the set then takes
    with _exclusive(pool / ".lock", rep, f"wheelhouse[{variant}]"):
        res = _pip_download(pool, [wanted], python_version, ["--no-deps", "--index-url", torch.index_url,
                                                              "--find-links", str(pool)])
    if res.returncode == 0:
        choice = {"requirement": wanted, "source": torch.index_url}
    else:
        rep.warn(f"variant {variant}: {torch.index_url} gave no {wanted} ({_last_line(res.stderr)}); "
                 f"using {torch.requirement} from pip's default index instead")
        choice = {"requirement": torch.requirement, "source": "default index (fallback)"}
    write_atomic(memo, json.dumps(choice))
    return choice["requirement"], choice["source"]


def image_set(settings: Settings, variant: str, python_version: str, torch_req: str) -> list[Requirement]:
    """The variant's whole requirement set for the image's Python: the runtime's, the project's, torch."""
    runtime, user = project_requirements(settings)
    torch = requirements.parse_line(torch_req, f"image.torch.{variant}")
    return requirements.combine(requirements.for_image(runtime, python_version),
                                requirements.for_image(user, python_version), torch)


def ensure_wheelhouse(settings: Settings, variant: str, python_version: str, rep: Reporter) -> Wheelhouse:
    torch_req, torch_source = choose_torch(settings, variant, python_version, rep)
    index = settings.image.torch[variant].index_url if torch_source not in DEFAULT_SOURCES else None
    wanted = image_set(settings, variant, python_version, torch_req)
    req_key = key_of("wheelhouse", python_version, sorted(r.key() for r in wanted), index)
    path = cache.writable(cache.WHEEL_SETS) / req_key[:16]
    pool = cache.writable(cache.WHEELS)
    found = _reuse(path, pool, variant, torch_source, rep)
    if found:
        return found
    with _exclusive(path.with_name(path.name + ".lock"), rep, f"wheelhouse[{variant}]"):
        # another build of the same requirements may have filled it while this one waited
        return _reuse(path, pool, variant, torch_source, rep) or _fill(path, pool, wanted, torch_req, index, variant,
                                                                         python_version, torch_source, rep)


def _reuse(path: Path, pool: Path, variant: str, torch_source: str, rep: Reporter) -> Optional[Wheelhouse]:
    data = _own_json(path / MANIFEST, _Manifest)
    if data is None:  # missing, a link, or damaged: filled again
        return None
    if len(data.sha256) != len(data.wheels) or not all(re.fullmatch(r"[0-9a-f]{64}", d) for d in data.sha256):
        return None  # damaged: filled again
    if not all(resolver.WHEEL_FILE.fullmatch(w) and os.path.isfile(pool / w) and not os.path.islink(pool / w)
               for w in data.wheels):
        return None  # a wheel pruned from the pool (or the cache cleared): filled again, only that one downloaded
    if _lock_lines(path / LOCK) != _lock_text(data.wheels, data.sha256).splitlines():
        rep.warn(f"wheelhouse[{variant}]: {path / LOCK} does not list the wheels its manifest does; the set is made "
                 "again")
        return None
    altered = _verify(path, pool, data.wheels, data.sha256)
    if altered is not None:
        rep.warn(f"wheelhouse[{variant}]: {pool / altered} is not the wheel its set recorded (its sha256 differs); it "
                 "is removed and the set is made again")
        (pool / altered).unlink(missing_ok=True)
        return None
    _touch(pool, data.wheels)
    rep.step(f"wheelhouse[{variant}]: reusing {path.name} ({len(data.wheels)} wheels, {human_bytes(data.size)}, "
             f"in {pool})")
    return Wheelhouse(path, data.key, data.requirements, data.wheels, data.size, torch_source, tuple(data.sha256), pool)


def _lock_text(wheels: list[str], digests: list[str]) -> str:
    """requirements.lock: each wheel pinned by name, version and sha256, in the set's order."""
    return "".join(f"{_pin(w)} --hash=sha256:{d}\n" for w, d in zip(wheels, digests))


def _lock_lines(path: Path) -> list[str] | None:
    """The lock file's lines as read back (None: missing, a link, too big or not text)."""
    try:
        return read_regular(path, 4 << 20, follow=False).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def _verify(path: Path, pool: Path, wheels: list[str], digests: list[str]) -> Optional[str]:
    """The first wheel whose bytes are not the sha256 the set recorded (None: all are). Only a wheel whose
    stat changed since it was last found good (VERIFIED) is hashed again; those found good are recorded."""
    known = _own_json(path / VERIFIED, _Verified)
    seen = dict(known.wheels) if known is not None else {}
    changed = False
    for w, digest in zip(wheels, digests):
        now = pool_page.fingerprint(pool / w)
        if seen.get(w) == now:
            continue
        if file_sha256(pool / w).hex != digest:
            return w
        seen[w], changed = pool_page.fingerprint(pool / w), True
    if changed:
        _write_verified(path, {w: seen[w] for w in wheels})
    return None


def _write_verified(path: Path, fingerprints: dict[str, tuple[int, int, int, int]]) -> None:
    try:
        write_atomic(path / VERIFIED, json.dumps({"wheels": fingerprints}).encode())
    except OSError:  # a read-only or full cache: the next reuse hashes again
        pass


def _touch(pool: Path, wheels: list[str]) -> None:
    """Mark the set's wheels used now (the pool's bound removes those used longest ago first), on a marker of
    each under USED: a wheel's own stat stays as it was found good (`_verify`)."""
    used = pool / USED
    try:
        used.mkdir(exist_ok=True)
    except OSError:
        return
    for w in wheels:
        try:
            (used / w).touch()
        except OSError:
            pass


def _last_used(pool: Path, name: str, st: os.stat_result) -> float:
    """When a wheel was last used: its marker's mtime, else its own (a wheel no set has used yet)."""
    try:
        return max(os.stat(pool / USED / name, follow_symlinks=False).st_mtime, st.st_mtime)
    except OSError:
        return st.st_mtime


def prune_pool(pool: Path, bound: int, keep: set[str], rep: Reporter) -> None:
    """Remove the wheels used longest ago until the pool holds at most BOUND bytes; never one in KEEP."""
    entries = []
    for e in os.scandir(pool):
        if e.is_file(follow_symlinks=False) and e.name.endswith(".whl"):
            st = e.stat(follow_symlinks=False)
            entries.append((_last_used(pool, e.name, st), e.name, st.st_size))
    total = sum(size for _, _, size in entries)
    if total <= bound:
        return
    freed = 0
    for _, name, size in sorted(entries):
        if total - freed <= bound:
            break
        if name in keep:
            continue
        (pool / name).unlink(missing_ok=True)
        (pool / USED / name).unlink(missing_ok=True)
        freed += size
    rep.detail(f"wheel pool over its bound ({human_bytes(bound)}, {MAX_POOL_ENV}): removed {human_bytes(freed)} of "
               "wheels used longest ago")


@contextmanager
def _exclusive(lock: Path, rep: Reporter, what: str):
    """One process at a time fills a wheelhouse: two builds of one project at once (or a test run
    beside a build) would otherwise empty each other's download directory."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            rep.step(f"{what}: another build is downloading the same wheels; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _fill(path: Path, pool: Path, wanted: list[Requirement], torch_req: str, index: Optional[str], variant: str,
          python_version: str, torch_source: str, rep: Reporter) -> Wheelhouse:
    """Download the set into the pool (pip skips the wheels already there) and write its manifest and lock at PATH."""
    full = [r.text for r in wanted]
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with _exclusive(pool / ".lock", rep, f"wheelhouse[{variant}]"):
        if index:
            res = _pip_download(pool, [torch_req], python_version, ["--no-deps", "--index-url", index])
            if res.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise WheelhouseError(f"pip could not fetch {torch_req} from {index}: {_last_line(res.stderr)}")
        before = set(os.listdir(pool))
        try:
            wheels, checked = _download(pool, full, python_version, variant, rep)
        except WheelhouseError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not wheels:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WheelhouseError(f"the requirement set of {variant} came to no wheel ({', '.join(full)[:2000]})")
        _touch(pool, wheels)
        new = [w for w in wheels if w not in before]
        sizes = {w: (pool / w).stat().st_size for w in wheels}
        digests = [checked.get(w) or file_sha256(pool / w).hex for w in wheels]  # those just fetched were hashed
        try:
            requirements.check_hashes(wanted, dict(zip(wheels, digests)))
        except ConfigError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pool_page.record(pool, dict(zip(wheels, digests)))
        prune_pool(pool, pool_bound(), set(wheels), rep)
    (tmp / LOCK).write_text(_lock_text(wheels, digests))
    _write_verified(tmp, {w: pool_page.fingerprint(pool / w) for w in wheels})
    key = key_of("wheels", list(zip(wheels, digests)), sorted(full))
    data = {"key": key, "requirements": full, "wheels": wheels, "size": sum(sizes.values()), "sha256": digests}
    (tmp / MANIFEST).write_text(json.dumps(data, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    rep.detail(f"{len(wheels)} wheels, {human_bytes(data['size'])}, torch from {torch_source}; "
               f"{len(new)} downloaded ({human_bytes(sum(sizes[w] for w in new))}), the rest already in the pool")
    return Wheelhouse(path, key, full, wheels, data["size"], torch_source, tuple(digests), pool)


def _download(pool: Path, full: list[str], python_version: str, variant: str,
              rep: Reporter) -> tuple[list[str], dict[str, str]]:
    """(the set's wheel files in the pool, the sha256 of those fetched and checked now), downloading the ones it
    lacks: uv resolves the set (toolchain/wheels/resolver.py) and they are fetched from the lock's URLs
    (`_fetch_pins`); without uv, pip resolves and downloads (wheels only)."""
    t0 = time.monotonic()
    try:
        pins = resolver.resolve(full, python_version, pool)
    except resolver.ResolveError as e:
        rep.warn(f"wheelhouse[{variant}]: {e}; pip resolves the set instead, from wheels only (where a dependency "
                 "is published only as an sdist, pip chooses an older release that does without it)")
        rep.step(f"wheelhouse[{variant}]: pip download of {len(full)} requirements for Python {python_version} "
                 f"(into {pool}: only the wheels it lacks)")
        return _pip_fetch(pool, full, python_version, variant, [], rep), {}
    have = resolver.in_pool(pins, pool, python_version)
    missing = [p.text for p in pins if p not in have]
    rep.step(f"wheelhouse[{variant}]: {len(pins)} packages resolved by uv in {time.monotonic() - t0:.1f}s; "
             f"{len(pins) - len(missing)} in the pool, {len(missing)} to download" + (f" ({', '.join(missing[:6])}"
                                                                                      f"{', ...' if len(missing) > 6 else ''})"
                                                                                      if missing else ""))
    fetched, checked = _fetch_pins(pool, [p for p in pins if p not in have], python_version, variant, rep)
    return sorted(set(have.values()) | set(fetched)), checked


def _fetch_pins(pool: Path, pins: list[resolver.Pin], python_version: str, variant: str,
                rep: Reporter) -> tuple[list[str], dict[str, str]]:
    """PINS' wheels into the pool: (the files, the sha256 of those fetched from the lock's URLs). Each pin's
    most specific wheel is fetched from its URL and checked against the lock (toolchain/wheels/download.py);
    pip downloads the others (a pin with no such wheel: an sdist only, whose wheel is built here; a file
    the index refused this client)."""
    return _fetch(pool, [(p.text, p.wheels[0] if p.wheels else None) for p in pins], python_version, variant, rep)


def _fetch(pool: Path, wanted: list[tuple[str, Optional[download.WheelFile]]], python_version: str, variant: str,
           rep: Reporter) -> tuple[list[str], dict[str, str]]:
    """WANTED ((`name==version`, the lock's wheel of it or None)) into the pool: from the lock's URL where there
    is one, pip for the rest. (The files, the sha256 of those fetched from the lock's URLs.)"""
    if not wanted:
        return [], {}
    direct = [w for _, w in wanted if w is not None]
    fetched, refused = download.fetch(pool, direct, rep, f"wheelhouse[{variant}]")
    if refused:
        name, why = next(iter(sorted(refused.items())))
        rep.detail(f"wheelhouse[{variant}]: {len(refused)} wheel(s) not fetched from the lock's URL ({name}: {why}); "
                   "pip downloads them")
    checked = {w.name: w.sha256 for w in direct if w.name in fetched}
    pool_page.record(pool, checked)
    rest = [req for req, w in wanted if w is None or w.name not in checked]
    if rest:
        fetched = fetched + _pip_fetch(pool, rest, python_version, variant, ["--no-deps"], rep)
    return sorted(set(fetched)), checked


@dataclass(frozen=True)
class SetFiles:
    """A requirement set's wheels in the pool (`set_files`)."""
    files: list[str]                        # the set's wheel files, in name order
    fetched: list[str]                      # those downloaded now
    lock: dict[str, download.WheelFile]     # the lock's wheel of each pin, by file name (`fetch_files` fetches from it)
    checked: dict[str, str]                 # the sha256 of those fetched now that were checked against it as they arrived


def set_files(pool: Path, full: list[str], python_version: str, variant: str, index: Optional[str],
              known: dict[tuple[str, str], str], rep: Reporter) -> SetFiles:
    """The wheels of the requirement set FULL. uv resolves the set; a pin KNOWN ((canonical name, version) ->
    file name: a previous image's record) is that file, downloaded or not; the others are the pool's, or
    downloaded (`_fetch_pins`; torch from INDEX when one is given)."""
    t0 = time.monotonic()
    try:
        pins = resolver.resolve(full, python_version, pool)
    except resolver.ResolveError as e:
        raise WheelhouseError(f"wheelhouse[{variant}]: {e}; a build with no engine resolves with uv only (where "
                              "an engine runs, pip resolves the set instead when uv cannot)") from None
    files = {p: known[(p.name, str(p.version))] for p in pins if (p.name, str(p.version)) in known}
    rest = [p for p in pins if p not in files]
    have = resolver.in_pool(rest, pool, python_version)
    missing = [p for p in rest if p not in have]
    rep.step(f"wheelhouse[{variant}]: {len(pins)} packages resolved by uv in {time.monotonic() - t0:.1f}s; "
             f"{len(files)} recorded by the previous image, {len(have)} in the pool, {len(missing)} to download")
    fetched: list[str] = []
    checked: dict[str, str] = {}
    if missing:
        with _exclusive(pool / ".lock", rep, f"wheelhouse[{variant}]"):
            before = set(os.listdir(pool))
            torch = [p.text for p in missing if p.name == "torch"]
            if index and torch:
                res = _pip_download(pool, torch, python_version, ["--no-deps", "--index-url", index])
                if res.returncode != 0:
                    raise WheelhouseError(f"pip could not fetch {torch[0]} from {index}: {_last_line(res.stderr)}")
            got = resolver.in_pool(missing, pool, python_version)  # torch, from INDEX
            _, checked = _fetch_pins(pool, [p for p in missing if p not in got], python_version, variant, rep)
            fetched = sorted(set(os.listdir(pool)) - before)
        have = resolver.in_pool(rest, pool, python_version)
    lost = [p.text for p in rest if p not in have]
    if lost:
        raise WheelhouseError(f"wheelhouse[{variant}]: the index gave no wheel of {', '.join(lost)} for Python "
                              f"{python_version}")
    _touch(pool, list(have.values()))
    lock = {p.wheels[0].name: p.wheels[0] for p in pins if p.wheels}
    fetched = [f for f in fetched if f in have.values()]
    return SetFiles(sorted(set(files.values()) | set(have.values())), fetched, lock,
                    {f: checked[f] for f in fetched if f in checked})


def fetch_files(pool: Path, files: list[str], python_version: str, variant: str, rep: Reporter,
                lock: dict[str, download.WheelFile]) -> tuple[list[str], dict[str, str]]:
    """Download the wheels FILES names into the pool: from the URL LOCK gives for the file, checked against its
    sha256; the others by name and version, pip picking the file. (The files, the sha256 of those checked
    as they arrived.)"""
    with _exclusive(pool / ".lock", rep, f"wheelhouse[{variant}]"):
        return _fetch(pool, [(_pin(f), lock.get(f)) for f in files], python_version, variant, rep)


def _pip_fetch(pool: Path, reqs: list[str], python_version: str, variant: str, extra: list[str],
               rep: Reporter) -> list[str]:
    """pip download of REQS into the pool (the wheels already there are found, not fetched): their file names."""
    extra = [*extra, "--find-links", str(pool)]
    res = _pip_download(pool, reqs, python_version, extra)
    built: set[str] = set()
    while res.returncode != 0:
        # a pure-Python package published only as an sdist (antlr4-python3-runtime 4.9.3, python-hostlist):
        # its wheel is built here; a py3-none-any wheel is the same for the image's Python and platform
        m = re.search(r"No matching distribution found for (\S+)", res.stderr)
        if not m or m.group(1) in built or not _build_pure_wheel(m.group(1), pool, rep):
            break
        built.add(m.group(1))
        res = _pip_download(pool, reqs, python_version, extra)
    if res.returncode != 0:
        raise WheelhouseError(f"pip download failed for {variant} ({', '.join(reqs)[:2000]}):\n    "
                              + "\n    ".join(res.stderr.strip().splitlines()[-8:]))
    return sorted({Path(m[1]).name for line in res.stdout.splitlines() if (m := _PIP_FILE.fullmatch(line))})


def _pin(wheel: str) -> str:
    """`name==version` of a wheel file name (the lock file's form)."""
    name, version = wheel.split("-")[:2]
    return f"{name}=={version}"


def _build_pure_wheel(requirement: str, dest: Path, rep: Reporter) -> bool:
    """`pip wheel` one sdist-only requirement on the host; kept only if the wheel is pure Python."""
    with tempfile.TemporaryDirectory() as out:
        # zip times fixed (the `wheel` backend reads SOURCE_DATE_EPOCH): the same sdist and backend give the
        # same wheel bytes, so the same layer, on every machine. Not from pip's wheel cache: a wheel pip
        # built there before (installing the package on this machine) has that day's times
        res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
                              "--no-cache-dir", "-w", out, requirement], capture_output=True, text=True,
                             env={**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")})
        wheels = list(Path(out).glob("*.whl"))
        if res.returncode != 0 or len(wheels) != 1 or not wheels[0].name.endswith("-none-any.whl"):
            return False
        shutil.copy2(wheels[0], dest / wheels[0].name)
    rep.detail(f"built the pure-Python wheel {wheels[0].name} from its sdist")
    return True


def _last_line(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else "no output"

"""Host-side wheelhouse: the locked requirement set downloaded with pip, for the image's Python.

The image build never touches the network: the dependency layers are written from these wheels
(toolchain/wheel_layers.py). Every wheel is kept once, in `<build_dir>/wheelhouse/pool/`, and a
requirement set is a directory of hard links to the pool's files (`<build_dir>/wheelhouse/<set key>/`)
with its manifest (each wheel's name, size and sha256) and `requirements.lock` (every wheel pinned
by name, version and hash). A new requirement set downloads only the wheels the pool lacks: pip
finds the others in the pool and says so. A set is reused as long as its requirements are
unchanged, so a re-run works offline.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from toolchain.atomic import write_atomic
from toolchain.blobs import file_sha256
from toolchain.config import Settings, TorchSettings
from toolchain.errors import ConfigError, WheelhouseError
from toolchain.hashing import key_of
from toolchain.progress import Reporter, human_bytes
from toolchain.wheel_checks import PLATFORMS  # the image's interpreter and glibc, not the host's
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "manifest.json"
LOCK = "requirements.lock"
POOL = "pool"  # <build_dir>/wheelhouse/pool/<wheel file>: every wheel once, whichever sets use it
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


class _TorchChoice(BaseModel):
    """The torch memo: which requirement and source were chosen (never an option: checked on reading)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    requirement: str
    source: str


def _own_json(path: Path, model: type[BaseModel]) -> Optional[BaseModel]:
    """A JSON file this toolchain wrote, parsed as MODEL; None when it is missing, a link or not a regular
    file, too big, or damaged (the caller then makes it again)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return None
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValueError, ValidationError, RecursionError):
        return None


_WHEEL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\.whl")


@dataclass
class Wheelhouse:
    path: Path
    key: str
    requirements: list[str]
    wheels: list[str]
    size: int
    torch_source: str
    sha256: tuple = ()  # each wheel's sha256 hex, in the order of `wheels`

    def digest_of(self, wheel: str) -> str:
        """The sha256 hex the manifest pins WHEEL (a file name of this set) to."""
        return dict(zip(self.wheels, self.sha256))[wheel]


def read_requirements(settings: Settings) -> list[str]:
    lines: list[str] = []
    for rel in settings.project.requirements:
        path = settings.path(rel)
        if not path.is_file():
            raise ConfigError(f"project.requirements: {rel!r} does not exist; create it or remove it from invoke.yaml")
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("-"):
                raise ConfigError(f"{rel}: pip options ({line!r}) are not supported in a lock file; list requirements only")
            if line:
                lines.append(line)
    for line in lines:
        if line.lower().replace("_", "-").split("=")[0].split("<")[0].split(">")[0].strip() == "torch":
            raise ConfigError(f"requirement {line!r}: torch is chosen per image variant; set image.torch.<variant> in invoke.yaml instead")
    return lines


def _pip_download(dest: Path, reqs: list[str], python_version: str, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
           "-d", str(dest), "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return subprocess.run(cmd + extra + reqs, capture_output=True, text=True)


def choose_torch(settings: Settings, variant: str, python_version: str, rep: Reporter) -> tuple[str, str]:
    """(requirement, source) for torch in a variant; the choice is remembered so re-runs work offline."""
    torch: TorchSettings = settings.image.torch[variant]
    if not torch.index_url:
        return torch.requirement, "default index"
    wanted = torch.index_requirement or torch.requirement
    memo = settings.build_dir / "wheelhouse" / f"torch-{key_of(python_version, torch.model_dump())[:16]}.json"
    known = {(wanted, torch.index_url), (torch.requirement, "default index (fallback)")}  # the only two choices
    remembered = _own_json(memo, _TorchChoice)
    if remembered is not None and (remembered.requirement, remembered.source) in known:
        return remembered.requirement, remembered.source
    rep.step(f"wheelhouse[{variant}]: looking for {wanted} on {torch.index_url}")
    with tempfile.TemporaryDirectory() as tmp:
        res = _pip_download(Path(tmp), [wanted], python_version, ["--no-deps", "--index-url", torch.index_url])
    if res.returncode == 0:
        choice = {"requirement": wanted, "source": torch.index_url}
    else:
        rep.warn(f"variant {variant}: {torch.index_url} gave no {wanted} ({_last_line(res.stderr)}); "
                 f"using {torch.requirement} from pip's default index instead")
        choice = {"requirement": torch.requirement, "source": "default index (fallback)"}
    write_atomic(memo, json.dumps(choice))
    return choice["requirement"], choice["source"]


def ensure_wheelhouse(settings: Settings, variant: str, python_version: str, rep: Reporter) -> Wheelhouse:
    torch_req, torch_source = choose_torch(settings, variant, python_version, rep)
    index = settings.image.torch[variant].index_url if torch_source not in ("default index", "default index (fallback)") else None
    full = read_requirements(settings) + [torch_req]
    req_key = key_of("wheelhouse", python_version, sorted(full), index)
    path = settings.build_dir / "wheelhouse" / req_key[:16]
    found = _reuse(path, variant, torch_source, rep)
    if found:
        return found
    with _exclusive(path.with_name(path.name + ".lock"), rep, f"wheelhouse[{variant}]"):
        # another build of the same requirements may have filled it while this one waited
        return _reuse(path, variant, torch_source, rep) or _fill(path, full, torch_req, index, variant,
                                                                   python_version, torch_source, rep)


def _reuse(path: Path, variant: str, torch_source: str, rep: Reporter) -> Optional[Wheelhouse]:
    data = _own_json(path / MANIFEST, _Manifest)
    if data is None:  # missing, a link, or damaged: filled again
        return None
    if len(data.sha256) != len(data.wheels) or not all(re.fullmatch(r"[0-9a-f]{64}", d) for d in data.sha256):
        return None  # a set written before the pool, or damaged: filled again
    if not all(_WHEEL_FILE.fullmatch(w) and os.path.isfile(path / w) and not os.path.islink(path / w)
               for w in data.wheels):
        return None
    rep.step(f"wheelhouse[{variant}]: reusing {path} ({len(data.wheels)} wheels, {human_bytes(data.size)})")
    return Wheelhouse(path, data.key, data.requirements, data.wheels, data.size, torch_source, tuple(data.sha256))


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


def _fill(path: Path, full: list[str], torch_req: str, index: Optional[str], variant: str, python_version: str,
          torch_source: str, rep: Reporter) -> Wheelhouse:
    """Download the set into the pool (pip skips the wheels already there) and link the set's wheels into PATH."""
    pool = path.parent / POOL
    pool.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    extra = ["--find-links", str(pool)]
    with _exclusive(pool.with_name(POOL + ".lock"), rep, f"wheelhouse[{variant}]"):
        if index:
            res = _pip_download(pool, [torch_req], python_version, ["--no-deps", "--index-url", index])
            if res.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise WheelhouseError(f"pip could not fetch {torch_req} from {index}: {_last_line(res.stderr)}")
        before = set(os.listdir(pool))
        rep.step(f"wheelhouse[{variant}]: pip download of {len(full)} requirements for Python {python_version} "
                 f"(into {pool}: only the wheels it lacks)")
        res = _pip_download(pool, full, python_version, extra)
        built: set[str] = set()
        while res.returncode != 0:
            # a pure-Python package published only as an sdist (e.g. python-hostlist): build its wheel
            # here; a py3-none-any wheel is the same for the image's Python and platform
            m = re.search(r"No matching distribution found for (\S+)", res.stderr)
            if not m or m.group(1) in built or not _build_pure_wheel(m.group(1), pool, rep):
                break
            built.add(m.group(1))
            res = _pip_download(pool, full, python_version, extra)
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WheelhouseError(f"pip download failed for {variant} ({', '.join(full)}):\n    " + "\n    ".join(res.stderr.strip().splitlines()[-8:]))
        wheels = sorted({Path(m[1]).name for line in res.stdout.splitlines() if (m := _PIP_FILE.fullmatch(line))})
        if not wheels:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WheelhouseError(f"pip download named no wheel for {variant}; its last line: {_last_line(res.stdout)}")
        for w in wheels:
            os.link(pool / w, tmp / w)  # the set's view of the pool: no second copy
    new = [w for w in wheels if w not in before]
    sizes = {w: (tmp / w).stat().st_size for w in wheels}
    digests = [file_sha256(tmp / w).removeprefix("sha256:") for w in wheels]
    (tmp / LOCK).write_text("".join(f"{_pin(w)} --hash=sha256:{d}\n" for w, d in zip(wheels, digests)))
    key = key_of("wheels", list(zip(wheels, digests)), sorted(full))
    data = {"key": key, "requirements": full, "wheels": wheels, "size": sum(sizes.values()), "sha256": digests}
    (tmp / MANIFEST).write_text(json.dumps(data, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    rep.detail(f"{len(wheels)} wheels, {human_bytes(data['size'])}, torch from {torch_source}; "
               f"{len(new)} downloaded ({human_bytes(sum(sizes[w] for w in new))}), the rest already in the pool")
    return Wheelhouse(path, key, full, wheels, data["size"], torch_source, tuple(digests))


def _pin(wheel: str) -> str:
    """`name==version` of a wheel file name (the lock file's form)."""
    name, version = wheel.split("-")[:2]
    return f"{name}=={version}"


def _build_pure_wheel(requirement: str, dest: Path, rep: Reporter) -> bool:
    """`pip wheel` one sdist-only requirement on the host; kept only if the wheel is pure Python."""
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
                              "-w", out, requirement], capture_output=True, text=True)
        wheels = list(Path(out).glob("*.whl"))
        if res.returncode != 0 or len(wheels) != 1 or not wheels[0].name.endswith("-none-any.whl"):
            return False
        shutil.copy2(wheels[0], dest / wheels[0].name)
    rep.detail(f"built the pure-Python wheel {wheels[0].name} from its sdist")
    return True


def _last_line(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else "no output"

"""A project's requirements as its user keeps them, read in one place, and the runtime's added.

A source is a file of project.requirements, read by its name:
  - `*.txt` (and any other name): a requirements file, plain or pip-tools/`uv export` output
    (`name==1.0 \\` with `--hash=sha256:...` lines, `# via` comments). Only `--hash` is taken as an
    option: an index, `-e`, `-r` or `-c` line is refused with the fix.
  - `pyproject.toml`: its `[project] dependencies` (PEP 508).
  - `pylock.toml` / `pylock.*.toml` (PEP 751): every package's pinned version and its files' hashes.
  - `uv.lock`: what `uv export` makes of it (the project's own dependencies, no dev groups, with hashes).
A requirement whose marker does not hold in the image (Linux, x86_64, CPython of the image's version)
is dropped there. Hashes are honoured: a downloaded wheel of a hashed requirement must have one of its
hashes (`check_hashes`).

torch, and the CUDA libraries and triton it brings, are the image variant's (image.torch): a user's
torch requirement is dropped when the variant's torch satisfies it, and is a conflict otherwise. The
runtime's requirements (runtime/requirements.txt) come first; a user requirement of the same package
whose versions cannot meet them is one error naming both.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.markers import InvalidMarker, Marker
from packaging.requirements import InvalidRequirement, Requirement as Pep508
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from toolchain.config_files import read_text
from toolchain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_REQUIREMENTS = 10_000
_HASH = re.compile(r"--hash[= ]sha256:([0-9a-fA-F]{64})")
# torch's own companions: the variant's torch brings them at its versions (image.torch)
_TORCH_COMPANION = re.compile(r"nvidia-[a-z0-9-]+-cu\d+|triton|pytorch-triton")


@dataclass(frozen=True)
class Requirement:
    """One requirement: TEXT as pip takes it (name, extras, specifier, marker; no hashes), from SOURCE
    (`file:line`), with the sha256 hashes its lock allows (empty: any)."""
    text: str
    name: str                 # canonical (PEP 503)
    specifier: SpecifierSet
    source: str
    marker: Optional[Marker] = None
    hashes: frozenset = field(default_factory=frozenset)

    @property
    def pinned(self) -> Optional[Version]:
        """The one version `==V` (or `===V`) allows, else None."""
        specs = list(self.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            try:
                return Version(specs[0].version)
            except InvalidVersion:
                return None
        return None

    def allows(self, version: Version) -> bool:
        return self.specifier.contains(version, prereleases=True)

    def key(self) -> list:
        """What the wheel set depends on (its key): the text and the hashes."""
        return [self.text, sorted(self.hashes)]


def parse_line(text: str, source: str, hashes: frozenset = frozenset()) -> Requirement:
    """One PEP 508 requirement; a ConfigError naming SOURCE when it is not one."""
    try:
        req = Pep508(text)
    except InvalidRequirement as e:
        raise ConfigError(f"{source}: {text[:120]!r} is not a requirement ({e}); write it as `name==1.2` or "
                          "`name>=1.2`") from None
    if req.url:
        raise ConfigError(f"{source}: {text[:120]!r} names a URL; the wheels come from the package index: give a "
                          "version instead (`name==1.2`)")
    return Requirement(str(req), canonicalize_name(req.name), req.specifier, source, req.marker, hashes)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0] if not raw.lstrip().startswith("#") else ""
        line = line.rstrip()
        if not buf:
            start = number
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def from_requirements_txt(text: str, shown: str) -> list[Requirement]:
    reqs = []
    for number, line in _logical_lines(text):
        source = f"{shown}:{number}"
        hashes = frozenset(h.lower() for h in _HASH.findall(line))
        rest = _HASH.sub("", line).strip()
        if re.search(r"--hash\b", rest):
            raise ConfigError(f"{source}: a --hash that is not sha256:<64 hex digits>; give sha256 hashes (pip-compile "
                              "--generate-hashes writes them)")
        if rest.startswith("-"):
            option = rest.split()[0].split("=")[0]
            raise ConfigError(
                f"{source}: the pip option {option} is not taken here; list requirements only (name==1.2 and their "
                "--hash lines). Another requirements file goes into project.requirements itself; an index for torch is "
                "image.torch.<variant>.index_url")
        reqs.append(parse_line(rest, source, hashes))
    return reqs


def from_pyproject(doc: dict, shown: str) -> list[Requirement]:
    project = doc.get("project")
    if not isinstance(project, dict):
        raise ConfigError(f"{shown}: no [project] table, so no dependencies to read; list a requirements file in "
                          "project.requirements instead")
    if "dependencies" in (project.get("dynamic") or []):
        raise ConfigError(f"{shown}: [project] dependencies are dynamic (computed by its build backend); list a "
                          "requirements file or lock file in project.requirements instead")
    deps = project.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ConfigError(f"{shown}: [project] dependencies is not a list of requirement strings; fix that file")
    return [parse_line(d, f"{shown} [project] dependencies[{i}]") for i, d in enumerate(deps)]


def from_pylock(doc: dict, shown: str) -> list[Requirement]:
    packages = doc.get("packages")
    if not isinstance(packages, list):
        raise ConfigError(f"{shown}: no [[packages]] array; is it a PEP 751 lock file (pylock.toml)?")
    reqs = []
    for i, pkg in enumerate(packages):
        source = f"{shown} [[packages]][{i}]"
        if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str):
            raise ConfigError(f"{source}: a package without a name; fix or regenerate the lock file")
        if "directory" in pkg or "vcs" in pkg or "archive" in pkg:
            continue  # the project itself, or code that is not on an index: the app layer holds the code
        version = pkg.get("version")
        if not isinstance(version, str):
            raise ConfigError(f"{source}: {pkg['name']!r} has no version; the lock must pin every package")
        hashes = set()
        for f in [*(pkg.get("wheels") or []), *([pkg["sdist"]] if isinstance(pkg.get("sdist"), dict) else [])]:
            sha = ((f or {}).get("hashes") or {}).get("sha256") if isinstance(f, dict) else None
            if isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha):
                hashes.add(sha.lower())
        marker = pkg.get("marker")
        text = f"{pkg['name']}=={version}" + (f" ; {marker}" if isinstance(marker, str) and marker else "")
        reqs.append(parse_line(text, source, frozenset(hashes)))
    return reqs


def uv_binary() -> Optional[str]:
    """The uv program: the `uv` package's own binary (a dependency of the toolchain), else uv on PATH."""
    try:
        import uv
        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def from_uv_lock(path: Path, shown: str) -> list[Requirement]:
    uv = uv_binary()
    if uv is None:
        raise ConfigError(f"{shown}: reading uv.lock needs uv, which is not installed; `pip install uv`, or list "
                          f"the output of `uv export --no-dev --no-emit-project > requirements.txt` in project.requirements")
    res = subprocess.run([uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-header",
                          "--format", "requirements-txt", "--project", str(path.parent)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"{shown}: uv could not export it ({last[:200]}); fix the lock (`uv lock`), or list a "
                          "requirements file instead")
    return from_requirements_txt(res.stdout, f"{shown} (uv export)")


def read(path: Path, shown: str) -> list[Requirement]:
    """The requirements of one source file (its kind from its name)."""
    if not path.is_file():
        raise ConfigError(f"project.requirements: {shown} does not exist; create it, or remove it from the settings")
    name = path.name
    if name == "uv.lock":
        return from_uv_lock(path, shown)
    text = read_text(path)
    if name.endswith(".toml"):
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{shown}: not valid TOML ({e}); fix that file") from None
        if name == "pyproject.toml":
            return from_pyproject(doc, shown)
        if name == "pylock.toml" or re.fullmatch(r"pylock\.[^.]+\.toml", name):
            return from_pylock(doc, shown)
        raise ConfigError(f"{shown}: a .toml file that is neither pyproject.toml nor pylock.toml; list a "
                          "requirements file, pyproject.toml, uv.lock or pylock.toml")
    return from_requirements_txt(text, shown)


def image_environment(python_version: str) -> dict:
    """Marker values for the image: Linux on x86_64, CPython PYTHON_VERSION (e.g. '3.11' or '3.11.2')."""
    full = python_version if python_version.count(".") >= 2 else f"{python_version}.0"
    return {"implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
            "platform_machine": "x86_64", "platform_python_implementation": "CPython", "platform_release": "",
            "platform_system": "Linux", "platform_version": "", "python_full_version": full,
            "python_version": ".".join(full.split(".")[:2]), "sys_platform": "linux", "extra": ""}


def for_image(reqs: list[Requirement], python_version: str) -> list[Requirement]:
    """The requirements whose markers hold in the image."""
    env = image_environment(python_version)
    kept = []
    for r in reqs:
        try:
            if r.marker is None or r.marker.evaluate(env):
                kept.append(r)
        except (InvalidMarker, ValueError) as e:  # a marker on a variable the image has no value for
            raise ConfigError(f"{r.source}: its marker {str(r.marker)!r} cannot be judged for the image ({e})") from None
    return kept


def _conflict(ours: Requirement, theirs: Requirement) -> bool:
    """Whether THEIRS cannot be met beside OURS (judged by the pins: pip resolves the ranges)."""
    a, b = ours.pinned, theirs.pinned
    if a is not None and b is not None:
        return a != b
    if a is not None:
        return not theirs.allows(a)
    if b is not None:
        return not ours.allows(b)
    return False


def combine(runtime: list[Requirement], user: list[Requirement], torch: Requirement) -> list[Requirement]:
    """The image's requirement set: the runtime's, then the user's (each once), then TORCH (the variant's).
    A user requirement that conflicts with the runtime's or with torch is a ConfigError naming both."""
    if len(runtime) + len(user) > MAX_REQUIREMENTS:
        raise ConfigError(f"more than {MAX_REQUIREMENTS} requirements; that is not a project's set")
    ours = {r.name: r for r in runtime}
    torch_version = torch.pinned
    out = list(runtime)
    for r in user:
        if r.name == "torch":
            if torch_version is None or r.allows(torch_version):
                continue
            raise ConfigError(
                f"requirement conflict: {r.source} asks for {r.text}, but this image variant's torch is {torch.text} "
                f"(image.torch); set image.torch.<variant>.requirement (and index_requirement) to a torch your project "
                "takes, or widen the project's requirement")
        if _TORCH_COMPANION.fullmatch(r.name):
            continue
        mine = ours.get(r.name)
        if mine is not None and _conflict(mine, r):
            raise ConfigError(
                f"requirement conflict: the runtime needs {mine.text} ({mine.source}) and {r.source} asks for {r.text}; "
                f"the runtime's own requirements cannot change: make the project's {r.name} a version "
                f"{mine.specifier} allows")
        out.append(r)
    return out + [torch]


def check_hashes(reqs: list[Requirement], wheels: dict[str, str]) -> None:
    """Every hashed requirement's downloaded wheel (file name -> sha256 hex) has one of its hashes."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for wheel, sha in wheels.items():
        by_name.setdefault(canonicalize_name(wheel.split("-")[0]), []).append((wheel, sha))
    for r in reqs:
        if not r.hashes:
            continue
        for wheel, sha in by_name.get(r.name, []):
            if sha not in r.hashes:
                raise ConfigError(
                    f"{r.source}: the lock allows {len(r.hashes)} hash(es) for {r.text}, and the downloaded {wheel} "
                    f"(sha256 {sha[:16]}...) is none of them; regenerate the lock, or check the package index")

"""Where a project's settings are, found from the current directory as git and pytest find theirs.

The nearest directory, from the current one up, that holds either
  - `raytrain.yaml`, or
  - a `pyproject.toml` with a `[tool.raytrain]` table
is the project's root; paths in its settings are relative to it. Its settings have the shape of the
toolchain's (toolchain/config.py: `project`, `image`, `registry`, `deploy`).

When one directory holds both, `raytrain.yaml` wins; a `[tool.raytrain]` table beside it must then be
empty or say the same, since two files that disagree would leave a reader guessing (an error naming
both). The project's name (its images, its job) is `project.name`, else `[project] name` of its
pyproject.toml, else the directory's name, made an image name (PEP 503's normalisation).
"""
from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from toolchain.boundary import ConfigFileError
from toolchain.config_files import load_yaml, read_text
from toolchain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the hosts here run 3.11
    import tomli as tomllib

YAML_FILE = "raytrain.yaml"
PYPROJECT = "pyproject.toml"
SETTING_KEYS = ("project", "image", "registry", "deploy", "quiet")
# an image repository's path component (the distribution spec), kept short enough for `<name>-stages`, and a
# letter first so that it is also a job name (a DNS-1035 label)
NAME_RE = re.compile(r"[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?")


@dataclass(frozen=True)
class Located:
    """The project found from a directory: its root, the file its settings came from (None: none was
    found, ROOT is the directory asked from), those settings, and the name its pyproject.toml declares."""
    root: Path
    file: Optional[Path]
    settings: dict = field(default_factory=dict)
    declared_name: Optional[str] = None

    @property
    def found(self) -> bool:
        return self.file is not None

    def name(self, setting: str = "") -> str:
        """The project's name: SETTING (project.name), else [project] name, else the directory's name."""
        if setting:
            return image_name(setting, f"project.name ({self.file or 'the settings'})")
        if self.declared_name:
            return image_name(self.declared_name, f"{self.root / PYPROJECT}: [project] name")
        return image_name(self.root.name or "project", f"{self.root}: the directory's name")


def read_toml(path: Path) -> dict:
    """PATH as TOML, read through the bounded reader (toolchain/config_files.py); one line naming it if not."""
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: not valid TOML ({e}); fix that file") from None
    except RecursionError:
        raise ConfigFileError(f"{path}: nested too deep; fix that file") from None


def _table(doc: dict, path: Path) -> Optional[dict]:
    """[tool.raytrain] of a pyproject.toml (None: it has none)."""
    tool = doc.get("tool")
    if not isinstance(tool, dict) or "raytrain" not in tool:
        return None
    table = tool["raytrain"]
    if not isinstance(table, dict):
        raise ConfigFileError(f"{path}: [tool.raytrain] is not a table; write it as `[tool.raytrain.project]` ... "
                              "(the settings of toolchain/config.py)")
    return table


def _settings_of(data: object, path: Path) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: the settings are not a mapping; give `project:`, `image:`, `registry:`, "
                              "`deploy:` sections")
    unknown = [k for k in data if k not in SETTING_KEYS]
    if unknown:
        raise ConfigFileError(f"{path}: unknown section {unknown[0]!r}; the sections are {', '.join(SETTING_KEYS)}")
    return data


def image_name(raw: str, where: str) -> str:
    """RAW (a Python project's name, a directory's) as an image and job name: PEP 503 normalised
    (lowercase, runs of '-', '_', '.' as one '-'). ConfigError naming WHERE when it cannot be one."""
    name = re.sub(r"[-_.]+", "-", raw.strip()).lower()
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"{where}: the project's name {raw[:60]!r} cannot name its images and jobs (it must become 1-40 "
            "lowercase letters, digits and '-', a letter first); set project.name (e.g. `name: my-project` under "
            f"`project:` in {YAML_FILE}, or `name = \"my-project\"` under [tool.raytrain.project])")
    return name


def declared_name(pyproject: Optional[dict]) -> Optional[str]:
    """[project] name of a parsed pyproject.toml, when it has one."""
    project = (pyproject or {}).get("project")
    name = project.get("name") if isinstance(project, dict) else None
    return name if isinstance(name, str) and name else None


def locate_in(directory: Path) -> Optional[Located]:
    """The project whose settings are in DIRECTORY itself, or None."""
    yaml_file, py_file = directory / YAML_FILE, directory / PYPROJECT
    has_yaml = os.path.lexists(yaml_file)
    pyproject = read_toml(py_file) if os.path.lexists(py_file) else None
    table = _table(pyproject, py_file) if pyproject is not None else None
    if not has_yaml and table is None:
        return None
    if has_yaml:
        settings = _settings_of(load_yaml(yaml_file), yaml_file)
        if table and _settings_of(table, py_file) != settings:
            raise ConfigFileError(
                f"{yaml_file} and [tool.raytrain] in {py_file} both hold settings, and they differ; keep one "
                f"(delete {YAML_FILE}, or the [tool.raytrain] tables)")
        source = yaml_file
    else:
        settings, source = _settings_of(table, py_file), py_file
    return Located(directory, source, settings, declared_name(pyproject))


@functools.lru_cache(maxsize=8)
def _locate(start: str) -> Located:
    here = Path(start)
    for directory in (here, *here.parents):
        found = locate_in(directory)
        if found is not None:
            return found
    return Located(here, None)


def locate(start: Optional[Path] = None) -> Located:
    """The project from START (default: the current directory) up; not found: Located(START, None)."""
    return _locate(str(Path(start or os.getcwd()).resolve()))


def settings(start: Optional[Path] = None):
    """The validated settings of the project from START as its own files give them (its settings over the
    defaults; no INVOKE_* variables, no flags): for scripts and benchmarks that act as `raytrain` would."""
    from invoke.config import Config, merge_dicts

    from toolchain.config import defaults, load_settings
    located = locate(start)
    if not located.found:
        raise not_found(located, "raytrain")
    return load_settings(Config(defaults=merge_dicts(defaults(), located.settings)), located)


def forget() -> None:
    """Look again next time (after `init` wrote settings)."""
    _locate.cache_clear()


def not_found(located: Located, program: str) -> ConfigError:
    return ConfigError(
        f"no raytrain project in {located.root} or above it (no {YAML_FILE}, no {PYPROJECT} with [tool.raytrain]); "
        f"run `{program} init --entry train.py` in your project's root, or `{program} init --example` in an empty "
        "directory")

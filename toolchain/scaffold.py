"""`raytrain init`: a project's settings written where Python projects keep theirs.

In a repository with a pyproject.toml they go into it as `[tool.raytrain]` tables (appended: the rest
of the file is left byte for byte); without one, into `raytrain.yaml`. Nothing is asked that can be
found out:
  - the code is the repository (project.app_dir "."), and its requirements the first of: uv.lock,
    pylock.toml, requirements.txt, pyproject.toml's [project] dependencies (each read and checked
    now: a file that does not parse is refused before anything is written);
  - the driver is `python <--entry>` (or `--command`, or `--torchrun "train.py ARGS"`: every node runs
    the script's ranks as torchrun would), or train.py when the repository has one;
  - the spec is a copy of the toolchain's cluster_specs/local.json named for the project (its
    images `<name>-cpu` / `<name>-gpu`), at cluster_specs/local.json unless one is there already.
Existing settings are never overwritten: init says what it would have written and exits 2.

`raytrain init --example` writes the toolchain's example project into an empty directory.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from runtime.spec import ClusterSpec
from toolchain import assets, project
from toolchain.wheels import requirements
from toolchain.errors import ConfigError
from toolchain.job_inputs import TORCHRUN, parse_command

SPEC = "cluster_specs/local.json"
EXAMPLE_COMMAND = ["python", "train.py", "--cpus-per-worker", "0.5"]
# the kinds of requirement source, in the order init prefers them (a lock first: it pins everything)
SOURCES = ("uv.lock", "pylock.toml", "requirements.txt", "pyproject.toml")
_ALLOWED_IN_EMPTY = {".git"}


@dataclass
class Plan:
    """What init writes: each file's path and text (new files, and the pyproject.toml as it will be)."""
    root: Path
    settings: dict
    settings_file: Path
    writes: dict[Path, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _spec_text(name: str) -> str:
    data = json.loads((assets.path("cluster_specs") / "local.json").read_text())
    data.update(cluster_name=name, cpu_image=f"{name}-cpu", gpu_image=f"{name}-gpu", node_name_prefix=f"{name}-")
    ClusterSpec.model_validate(data)  # the copy is a valid spec before it is written
    return json.dumps(data, indent=2) + "\n"


def _requirement_source(root: Path, pyproject: Optional[dict]) -> Optional[str]:
    """The repository's requirement source init takes (None: it has none), checked to parse."""
    for name in SOURCES:
        path = root / name
        if not path.is_file():
            continue
        if name == "pyproject.toml" and not ((pyproject or {}).get("project") or {}).get("dependencies"):
            continue
        requirements.read(path, name)  # a file that does not parse: ConfigError, nothing written
        return name
    return None


def _command(root: Path, entry: Optional[str], command: Optional[str], torchrun: Optional[str] = None) -> list[str]:
    if sum(x is not None for x in (entry, command, torchrun)) > 1:
        raise ConfigError("--entry, --command and --torchrun: give one (--entry train.py runs `python train.py`)")
    if command is not None:
        return parse_command(command)
    if torchrun is not None:  # every node runs the script's ranks (runtime/workers/script_ranks.py)
        target = parse_command(torchrun, "--torchrun")
        if target[0] != "-m" and not (root / target[0]).is_file():
            raise ConfigError(f"--torchrun: {target[0][:80]!r} is not a file in {root}; give the script torchrun runs")
        return [*TORCHRUN, "--", *target]
    if entry is None:
        if (root / "train.py").is_file():
            return ["python", "train.py"]
        scripts = sorted(p.name for p in root.glob("*.py"))[:8]
        raise ConfigError("--entry: which script starts the training? e.g. `raytrain init --entry train.py`"
                          + (f" (Python files here: {', '.join(scripts)})" if scripts else
                             " (or --command \"python -m mypackage.train\")"))
    script = Path(entry)
    if script.is_absolute() or ".." in script.parts:
        raise ConfigError(f"--entry: {entry[:80]!r} must be a path inside the project (relative to {root})")
    if not (root / script).is_file():
        raise ConfigError(f"--entry: {entry[:80]!r} is not a file in {root}; give the script that starts the training")
    return ["python", script.as_posix()]


def _existing_settings(root: Path, pyproject: Optional[dict]) -> Optional[Path]:
    if os.path.lexists(root / project.YAML_FILE):
        return root / project.YAML_FILE
    if pyproject is not None and isinstance(pyproject.get("tool"), dict) and "raytrain" in pyproject["tool"]:
        return root / project.PYPROJECT
    return None


def _toml_tables(settings: dict) -> str:
    import tomli_w
    return tomli_w.dumps({"tool": {"raytrain": settings}})


def plan_init(root: Path, entry: Optional[str] = None, command: Optional[str] = None,
              name: Optional[str] = None, torchrun: Optional[str] = None) -> Plan:
    """What `init` would write in ROOT; ConfigError (nothing written) for a directory that is no project,
    settings already there, or a requirement file that does not parse."""
    py_file = root / project.PYPROJECT
    pyproject = project.read_toml(py_file) if py_file.is_file() else None
    found = [n for n in (*SOURCES, "setup.py", "setup.cfg") if (root / n).is_file()]
    if not found:
        raise ConfigError(
            f"{root} is not a Python project (no pyproject.toml, requirements.txt, uv.lock or pylock.toml); run init "
            "in your project's root, or `raytrain init --example` in an empty directory for the example")
    located = project.Located(root, None, {}, project.declared_name(pyproject))
    project_name = located.name(name or "")
    source = _requirement_source(root, pyproject)
    settings: dict = {"project": {}, "deploy": {"command": _command(root, entry, command, torchrun)}}
    if name or not located.declared_name:  # a directory's name changes with the checkout: written down
        settings["project"]["name"] = project_name
    settings["project"].update({"app_dir": ".", "requirements": [source] if source else [], "spec": SPEC})
    shown = _toml_tables(settings) if py_file.is_file() else yaml.safe_dump(settings, sort_keys=False)
    existing = _existing_settings(root, pyproject)
    if existing is not None:
        raise ConfigError(f"{existing} already holds raytrain settings; init overwrites nothing. It would have "
                          f"written:\n{shown.rstrip()}")
    if py_file.is_file():
        text = py_file.read_text()
        out = text + ("" if text.endswith("\n") or not text else "\n") + "\n" + shown
        try:
            project.tomllib.loads(out)  # the file as it will be still parses
        except project.tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{py_file}: [tool.raytrain] cannot be added to it ({e}); add the tables by hand:\n"
                              f"{shown.rstrip()}") from None
        plan = Plan(root, settings, py_file, {py_file: out})
    else:
        plan = Plan(root, settings, root / project.YAML_FILE, {root / project.YAML_FILE: shown})
    if (root / SPEC).exists():
        plan.notes.append(f"{SPEC} exists: used as the project's spec, not written again")
    else:
        plan.writes[root / SPEC] = _spec_text(project_name)
    if not source:
        plan.notes.append("no requirements file found: the image has the runtime's requirements and torch; list yours "
                          "in project.requirements")
    ignore = root / ".gitignore"
    if ignore.is_file() and "build" not in ignore.read_text():
        plan.notes.append("add build/ to .gitignore: the build's records and layers go there")
    return plan


def plan_example(root: Path, name: Optional[str] = None) -> Plan:
    """The example project, into the empty directory ROOT."""
    if root.exists():
        left = sorted(set(os.listdir(root)) - _ALLOWED_IN_EMPTY)
        if left:
            raise ConfigError(f"init --example: {root} is not empty ({', '.join(left[:5])}); run it in an empty "
                              "directory (mkdir demo && cd demo)")
    project_name = project.Located(root, None).name(name or "")
    settings = {"project": {"name": project_name, "app_dir": ".", "requirements": ["requirements.txt"], "spec": SPEC},
                "deploy": {"command": EXAMPLE_COMMAND}}
    example = assets.path("example")
    writes = {root / f.name: f.read_text() for f in sorted(example.iterdir()) if f.suffix in (".py", ".txt")}
    writes[root / project.YAML_FILE] = yaml.safe_dump(settings, sort_keys=False)
    writes[root / SPEC] = _spec_text(project_name)
    return Plan(root, settings, root / project.YAML_FILE, writes)


def apply(plan: Plan) -> list[Path]:
    """Write the plan's files: new ones exclusively (a file that appeared meanwhile is not overwritten),
    the pyproject.toml by replacing it whole."""
    written = []
    for path, text in plan.writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == project.PYPROJECT and path.exists():
            tmp = path.with_name(f".{path.name}.raytrain-init")
            tmp.write_text(text)
            shutil.copymode(path, tmp)
            tmp.replace(path)
        else:
            with open(path, "x") as f:
                f.write(text)
        written.append(path)
    project.forget()
    return written

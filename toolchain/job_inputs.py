"""What a job is given by its user, read the same way by every step that takes it (deploy in
toolchain/pipeline.py, up and run in toolchain/held.py): text flags, the spec file, the driver
command, the run id and the time it is recorded with."""
from __future__ import annotations

import secrets
import time
from pathlib import Path

from runtime.spec import load_spec
from toolchain.config import Settings
from toolchain.errors import ConfigError
from toolchain.records import read_runs, runs_file


def given(value: str | None, flag: str) -> str | None:
    """A text flag: None when left out (the default applies); an empty or blank value is an error,
    never a silent fall-back to the default."""
    if value is not None and not value.strip():
        raise ConfigError(f"{flag}: empty; give a value, or leave the flag out to use the default")
    return value


def resolve_spec(settings: Settings, spec: str | None) -> Path:
    path = settings.path(given(spec, "--spec") or settings.project.spec)
    load_spec(path)  # raises SpecError with every problem listed
    return path


def parse_command(text: str) -> list[str]:
    """--command as a shell would split it (quotes kept together); nothing is ever run through a shell."""
    import shlex
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"--command: {text[:80]!r} cannot be split as a shell would ({e}); close the quotes") from None
    if not argv:
        raise ConfigError("--command: empty; give the driver command, e.g. \"python train.py --steps 200\"")
    if argv[0].startswith("-"):  # it would follow a scheduler tool's own options (srun, kubectl exec, sky)
        raise ConfigError(f"--command: {argv[0][:40]!r} is an option, not a program; the command starts with the "
                          "program to run, e.g. \"python train.py --steps 200\"")
    return argv


def pick_run(settings: Settings, name: str, resume: bool) -> str:
    """A new run id (<name>-<UTC time>-<4 hex>), or with --resume the last one deployed under this name."""
    if resume:
        last = read_runs(settings.build_dir).get(name)
        if last is None:
            raise ConfigError(f"--resume: no earlier run of --name {name!r} in {runs_file(settings.build_dir)}; "
                              "deploy without --resume to start one")
        return last.run_id
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

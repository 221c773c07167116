"""What a job is given by its user, read the same way by every step that takes it (deploy in
toolchain/pipeline.py, up and run in toolchain/held.py): text flags, the spec file, the driver
command, the run id and the time it is recorded with."""
from __future__ import annotations

import re
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


def out_dir(settings: Settings, out: str | None) -> Path | None:
    """--out: the directory the artifacts go to (None: the default), refused before anything is rendered when
    it reads as an option or a file stands where a directory would be made."""
    if given(out, "--out") is None:
        return None
    if out.startswith("-"):
        raise ConfigError(f"--out: {out[:80]!r} starts with '-', as an option does (a flag without its value?); "
                          f"give a directory, ./{out[:80]} for one named so")
    path = settings.path(out)
    for place in (path, *path.parents):
        if place.exists():
            if place == path and not place.is_dir():
                raise ConfigError(f"--out: {path} exists and is not a directory; give a directory for the artifacts")
            if not place.is_dir():
                raise ConfigError(f"--out: {place} is not a directory, so {path} cannot be made there; give a "
                                  "directory for the artifacts")
            break
    return path


def resolve_spec(settings: Settings, spec: str | None) -> Path:
    path = settings.path(given(spec, "--spec") or settings.project.spec)
    load_spec(path)  # raises SpecError with every problem listed
    return path


def parse_command(text: str, flag: str = "--command") -> list[str]:
    """FLAG's command as a shell would split it (quotes kept together); nothing is ever run through a shell.
    For --command, the first word is the program; for --torchrun, the script (or -m MODULE)."""
    import shlex
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"{flag}: {text[:80]!r} cannot be split as a shell would ({e}); close the quotes") from None
    example = "\"train.py --epochs 3\"" if flag == "--torchrun" else "\"python train.py --steps 200\""
    if not argv:
        raise ConfigError(f"{flag}: empty; give it, e.g. {example}")
    if argv[0].startswith("-") and argv[:1] != ["-m"] or argv[:1] == ["-m"] and flag != "--torchrun":
        # it would follow a scheduler tool's own options (srun, kubectl exec, sky), or torchrun's
        raise ConfigError(f"{flag}: {argv[0][:40]!r} is an option, not a {'script' if flag == '--torchrun' else 'program'}; "
                          f"give e.g. {example}")
    return argv


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
OWN_ENV = "RAYTRAIN_"  # the runtime's own variables (runtime/contract.py): set by the targets, never by the user


def job_env(settings: Settings, given_env: list[str] | None) -> dict[str, str]:
    """The environment every process of the job gets: deploy.env, then each --env KEY=VALUE over it. Not for
    secrets: the values are written into the job's artifacts (an sbatch script, a manifest, a task)."""
    out: dict[str, str] = {}
    items = [(f"deploy.env.{k}", k, v) for k, v in settings.deploy.env.items()]
    for text in given_env or []:
        key, eq, value = text.partition("=")
        if not eq:
            raise ConfigError(f"--env: {text[:80]!r} is not KEY=VALUE; give e.g. --env NCCL_DEBUG=INFO")
        items.append(("--env", key, value))
    for where, key, value in items:
        if not ENV_NAME.fullmatch(key):
            raise ConfigError(f"{where}: {key[:60]!r} is not an environment variable name (a letter or '_' first, "
                              "then letters, digits, '_')")
        if key.upper().startswith(OWN_ENV):
            raise ConfigError(f"{where}: {key} is the runtime's own variable (RAYTRAIN_*), set for every job; give "
                              "another name")
        if "\x00" in value:
            raise ConfigError(f"{where}: the value of {key} contains NUL, which no process can be given")
        out[key] = value
    return out


TORCHRUN = ("python", "-m", "runtime", "torchrun")  # runtime/workers/script_ranks.py, the driver of a torchrun script


def driver_command(settings: Settings, command: str | None, torchrun: str | None = None, nproc: int | None = None,
                   max_restarts: int | None = None) -> list[str]:
    """The job's driver: --command, or a torchrun script (--torchrun "train.py ARGS", every node running
    --nproc-per-node ranks of it, restarted together up to --max-restarts), else deploy.command. A
    script that is not in the code is refused here, before any node starts (and `ranks_fit`)."""
    torchrun = given(torchrun, "--torchrun")
    options = [*(["--nproc-per-node", str(nproc)] if nproc is not None else []),
               *(["--max-restarts", str(max_restarts)] if max_restarts is not None else [])]
    if torchrun is None:
        configured = list(settings.deploy.command)
        if options and (command is not None or tuple(configured[:len(TORCHRUN)]) != TORCHRUN or "--" not in configured):
            flag = "--nproc-per-node" if nproc is not None else "--max-restarts"
            raise ConfigError(f"{flag}: it is a --torchrun option; give --torchrun \"train.py ARGS\" with it (or make "
                              "deploy.command a torchrun one: raytrain init --torchrun)")
        if options:  # the settings' torchrun command, these options last (the runtime takes the last of each)
            cut = configured.index("--")
            return [*configured[:cut], *options, *configured[cut:]]
        return configured if command is None else parse_command(command)
    if command is not None:
        raise ConfigError("--torchrun and --command: give one (--torchrun runs a torchrun script on every node; "
                          "--command runs a driver on the head)")
    target = parse_command(torchrun, "--torchrun")
    if target[0] == "-m":
        if len(target) < 2:
            raise ConfigError("--torchrun: -m needs the module, e.g. --torchrun \"-m mypackage.train\"")
    else:
        app_dir = settings.path(settings.project.app_dir)
        script = Path(target[0])
        if script.is_absolute() or ".." in script.parts or not (app_dir / script).is_file():
            raise ConfigError(f"--torchrun: {target[0][:80]!r} is not a script in the project's code ({app_dir}); give "
                              "its path relative to project.app_dir, e.g. --torchrun \"train.py --epochs 3\"")
    return [*TORCHRUN, *options, "--", *target]


def ranks_fit(nproc: int | None, gpus: int) -> None:
    """--nproc-per-node against the GPUS a node of the job asks for (none asked: any number of CPU ranks)."""
    if nproc is not None and gpus and nproc > gpus:
        raise ConfigError(f"--nproc-per-node: {nproc} ranks per node, but the job asks for {gpus} GPU(s) a node; "
                          f"give at most {gpus} (one rank per GPU), or more --gpus")


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

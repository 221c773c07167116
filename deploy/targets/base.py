"""What every deploy target is: its own options, a pre-flight, a pure render, and an apply step.

    options = target.parse_options(flags)        # the flags this target takes; any other is an error
    problems = target.preflight(job, spec, opts) # every problem at once, nothing touched, nothing asked
    site = target.site_check(job, spec, opts)    # what only the live system knows (read-only questions)
    artifacts = target.render(job, spec, opts)   # pure: objects and the files made from them
    result = target.apply(artifacts, ctx)        # convert / write / submit / run, as the options say

`render` returns the objects it serialised alongside the file texts, so `apply` never parses a file
back. Adding a target is one module with a `TARGET` plus its line in `deploy.targets.TARGETS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Optional, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError

from deploy import hint
from deploy.engine_pull import FromBuild
from deploy.handles import ClusterStatus, Handle
from deploy.layer_store import LayerStore
from deploy.artifacts import write_all
from deploy.job import IMAGE_WORKDIR, DeployError, JobSpec, PreflightError
from runtime.spec import ClusterSpec

class TargetOptions(BaseModel):
    """Base of every target's options: strict types, unknown flags refused.

    Every field is a flag of `invoke deploy` (deploy/targets/flags.py): its description is the flag's
    help (the targets that take it are prefixed), its type and default make the flag, and `ge`/`le`
    bound a whole number. A field the CLI must not offer: `json_schema_extra={"cli": False}`.
    """
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    submit: bool = Field(False, description=(
        "start what was written, not only write it: slurm/pyxis: sbatch the script; k8s: create the token "
        "Secret and kubectl apply; skypilot: sky launch (local runs the job with or without it)."))


def is_cli(field) -> bool:
    """Whether an Options field is a flag of `invoke deploy` (not plumbing the pipeline sets)."""
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get("cli") is False)


# options several targets take: one definition each, so their flags agree
AllowLocalRegistry = Annotated[bool, Field(False, description=(
    "accept an image in a loopback registry (only when the nodes are this machine; otherwise push to a "
    "registry they reach, or use --sqsh)."))]


@dataclass(frozen=True)
class File:
    text: str
    mode: int = 0o644


@dataclass
class Artifacts:
    files: dict[str, File] = field(default_factory=dict)  # name -> content, written all at once
    objects: list[Any] = field(default_factory=list)       # what the files were serialised from
    notes: list[str] = field(default_factory=list)         # things the user should know; not errors
    extra: dict[str, Any] = field(default_factory=dict)    # target-specific plan (e.g. the .sqsh to make)

    def texts(self) -> dict[str, str]:
        return {name: f.text for name, f in self.files.items()}


class Applied(BaseModel):
    """What a target's apply did: the fields it has, the others left at their defaults."""
    model_config = ConfigDict(extra="forbid")
    written: list[str] = Field(default_factory=list)   # the files, where they were written
    exit_code: Optional[int] = None                     # a job run here (local): the head's exit code
    diagnosis: Optional[str] = None                     # ... and which node failed first, and why
    held: Optional[SerializeAsAny[Handle]] = None       # a held cluster's handle (job.serve): clusters.json
    slurm_job_id: Optional[str] = None
    kubectl: Optional[str] = None                       # what kubectl apply said
    launched: list[str] = Field(default_factory=list)   # SkyPilot clusters launched
    sqsh: Optional[str] = None                          # Pyxis --sqsh: the file srun is told


@dataclass(frozen=True)
class Destroyed:
    """What a target's destroy removed: one line to say, and the launched names it removed (their records go)."""
    group: str
    said: str
    removed: list = field(default_factory=list)
    details: dict = field(default_factory=dict)  # what the target's tool answered (kubectl's output, the namespace)


@dataclass
class SiteCheck:
    """What the live system (a cluster, a registry) said: problems stop the deploy, notes are shown."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class HeldContext:
    """What a held cluster's operations get (toolchain/held.py): no state of their own but the handle."""
    engine: Callable[[], Any]                 # docker client factory (local)
    env: dict                                 # environment for scheduler CLIs (srun, squeue, scancel)
    out: Any = None                           # where a run's output goes (default: stdout)


@dataclass
class ApplyContext:
    out_dir: Path
    engine: Callable[[], Any]                 # docker client factory (only targets that need one call it)
    progress: Callable[[str], None]
    env: Optional[dict] = None                # environment for scheduler CLIs (sbatch, kubectl, sky)
    layer_store: Optional[LayerStore] = None  # the build's assembled layers (an incremental .sqsh uses them)
    from_build: Optional[FromBuild] = None    # puts a pushed image the engine lacks there from this machine's build
    # told the names of what is about to be launched and outlives the command (SkyPilot's clusters),
    # before it is: `destroy` removes exactly what was recorded (build/launched.json)
    launching: Callable[[list[str]], None] = lambda names: None

    def write(self, artifacts: Artifacts) -> list[Path]:
        written = write_all(self.out_dir, artifacts.texts(), {n: f.mode for n, f in artifacts.files.items()})
        for w in written:
            self.progress(f"wrote {w}")
        return written


@runtime_checkable
class HeldOps(Protocol):
    """How a target reaches a held cluster through its scheduler's CLI (a module: slurm/held.py, ...)."""

    def status(self, handle: Any, env: dict) -> ClusterStatus: ...

    def run(self, handle: Any, env: dict, code_tar: bytes, rel_dir: str, argv: list[str], run_env: dict,
            out: Any) -> int: ...

    def down(self, handle: Any, env: dict) -> list[str]: ...


@runtime_checkable
class StatusMany(Protocol):
    """HeldOps whose scheduler answers for every held cluster at once (Slurm's one squeue)."""

    def status_many(self, handles: list, env: dict) -> list[ClusterStatus]: ...


class Target:
    """A deploy target. Subclasses set `name`, `Options`, `summary`, and implement the three steps."""
    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[TargetOptions]] = TargetOptions
    needs_image: ClassVar[bool] = True       # False: runs in the nodes' own environment (plain sbatch)
    pulls_image: ClassVar[bool] = False      # True: compute nodes pull the image from its registry
    # what to do instead when the nodes cannot reach the image's registry
    unreachable_registry_fix: ClassVar[str] = "or load the image on every node yourself"

    def parse_options(self, flags: dict) -> TargetOptions:
        """The flags given for this target; a flag it does not take is an error naming its flags."""
        try:
            return self.Options.model_validate(flags)
        except ValidationError as e:
            known = ", ".join("--" + f.replace("_", "-") for f, info in self.Options.model_fields.items()
                              if is_cli(info))
            lines = []
            for err in e.errors():
                flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "(options)"
                if err["type"] == "extra_forbidden":
                    lines.append(f"{flag}: not an option of the {self.name} target (its options: {known})")
                else:
                    lines.append(f"{flag}: {err['msg'].removeprefix('Value error, ')} (got {str(err.get('input'))[:80]!r})")
            raise PreflightError(lines) from None

    def pulls_from_registry(self, opts: TargetOptions) -> bool:
        return self.pulls_image

    def allows_local_registry(self, opts: TargetOptions) -> bool:
        """--allow-local-registry, for a target that takes it."""
        return False

    def port_stride(self, opts: TargetOptions) -> int:
        """How far apart the nodes' Ray ports are (--port-stride, for a target whose nodes share a host)."""
        return 0

    def build_dir_options(self, build_dir: Path) -> dict:
        """Options that are not flags, which this target keeps under the project's build directory
        (Pyxis: where its .sqsh files are cached); the deploy pipeline passes them with the flags."""
        return {}

    def spec_gpus(self, spec: ClusterSpec) -> int:
        """GPUs per node when --gpus is not given."""
        return 0

    def job_workdir(self, app_dir: Path) -> Optional[str]:
        """Where the command runs: the image's project directory (plain Slurm: the app on the shared disk)."""
        return IMAGE_WORKDIR

    def preflight(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> list[str]:
        return []

    def destroy(self, spec: ClusterSpec, name: str, launched: list[str]) -> Destroyed:
        """Delete what `deploy --submit` left running for the job NAME. LAUNCHED: what the build directory recorded as launched under
        NAME (ApplyContext.launching). A target whose jobs end by themselves has nothing to delete."""
        raise DeployError(f"--target {self.name}: nothing to destroy (its jobs end by themselves; a held cluster "
                          f"ends with `{hint.cmd('down')}`); `{hint.cmd('destroy --target k8s')}` deletes what "
                          "`deploy --target k8s --submit` created, `--target skypilot` the clusters it launched")

    def site_check(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> SiteCheck:
        """Ask the live system what only it knows, after a clean pre-flight; never changes anything."""
        return SiteCheck()

    def render(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> Artifacts:
        raise NotImplementedError

    def apply(self, artifacts: Artifacts, job: JobSpec, spec: ClusterSpec, opts: TargetOptions,
              ctx: ApplyContext) -> Applied:
        return Applied(written=[str(p) for p in ctx.write(artifacts)])

    # -- a held cluster (invoke up / run / status / down): apply of a `job.serve` job returns
    # Applied(held=handle), an instance of the target's `handle` model (deploy/handles.py), which these
    # operations get back (build/clusters.json keeps it as JSON, checked against `handle` when read).
    # A target that reaches its nodes through a CLI names the module that does it (`held`, a HeldOps);
    # one that needs more (the local target's Docker engine) overrides the methods below.
    handle: ClassVar[Optional[type[Handle]]] = None  # None: the target holds no clusters
    held: ClassVar[Optional["HeldOps"]] = None

    @property
    def holds_clusters(self) -> bool:
        return self.handle is not None

    def held_status(self, handle: Handle, ctx: HeldContext) -> ClusterStatus:
        return self.held.status(handle, ctx.env)

    def held_status_many(self, handles: list[Handle], ctx: HeldContext) -> list[ClusterStatus]:
        """held_status of each of HANDLES, in order; a held module whose scheduler answers for all at
        once (`status_many(handles, env)`: Slurm's one squeue) is asked once."""
        if isinstance(self.held, StatusMany):
            return self.held.status_many(handles, ctx.env)
        return [self.held_status(h, ctx) for h in handles]

    def held_run(self, handle: Handle, ctx: HeldContext, code_tar: bytes, rel_dir: str, argv: list[str],
                 run_env: dict) -> int:
        """Unpack CODE_TAR (paths under REL_DIR) where the head reads it and run ARGV there through
        `python -m runtime run` with RUN_ENV; the driver's exit code."""
        return self.held.run(handle, ctx.env, code_tar, rel_dir, argv, run_env, ctx.out)

    def held_down(self, handle: Handle, ctx: HeldContext) -> list[str]:
        """End it (the head stops serving, the nodes leave) and remove what it left; what was removed."""
        return self.held.down(handle, ctx.env)

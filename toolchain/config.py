"""Typed toolchain settings: the one source of the project's defaults.

tasks.py hands `defaults()` to Invoke as the collection's configuration; a user overrides them in
an `invoke.yaml` of their own, with INVOKE_* environment variables (checked before Invoke reads
them: `check_env`), or with flags. `load_settings` validates the merged result.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from deploy.job import MAX_CPUS_PER_NODE, MAX_NODES
from runtime import numbers
from runtime.contract import DEFAULT_PORT_BASE
from runtime.errors import InputError
from toolchain.errors import ConfigError

VARIANTS = ("cpu", "gpu")


class _Strict(BaseModel):
    # strict as the spec is: `nodes: true` is not 1 and '2' is not 2; NaN and infinity are not numbers
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class BootstrapSettings(_Strict):
    suite: str = "bookworm"
    mirror: str = Field("", description="Debian mirror URL; empty = the first one in the host's apt sources.")
    packages: list[str] = Field(default_factory=lambda: ["python3", "python3-venv", "procps", "iproute2", "tini"])


class TorchSettings(_Strict):
    requirement: str = Field(..., description="Requirement line for torch in this variant.")
    index_url: Optional[str] = Field(None, description="Index holding a special torch build (e.g. CPU-only).")
    index_requirement: Optional[str] = Field(None, description="Requirement to ask index_url for.")


USER_NAME = r"^[a-z_][a-z0-9_-]{0,31}$"  # Debian's NAME_REGEX, bounded as useradd's


class UserSettings(_Strict):
    name: str = Field("ray", pattern=USER_NAME,
                      description="The image's user: lower-case letters, digits, '_' and '-', as useradd takes.")
    uid: int = Field(1000, ge=1, le=2**31 - 1, description="Numeric uid of the image's USER (a kubelet verifies runAsNonRoot by it).")
    gid: int = Field(1000, ge=1, le=2**31 - 1, description="Numeric gid of the image's USER and the pods' fsGroup.")


class ImageSettings(_Strict):
    repository: str = "raytrain"
    human_tag: str = "latest"
    variants: list[str] = Field(default_factory=lambda: list(VARIANTS))
    base_image: str = Field("", description="Existing image to build on; empty = bootstrap one with debootstrap.")
    bootstrap: BootstrapSettings = Field(default_factory=BootstrapSettings)
    torch: dict[str, TorchSettings] = Field(default_factory=lambda: {
        "cpu": TorchSettings(requirement="torch==2.9.1", index_url="https://download.pytorch.org/whl/cpu",
                             index_requirement="torch==2.9.1+cpu"),
        "gpu": TorchSettings(requirement="torch==2.9.1")})
    user: UserSettings = Field(default_factory=UserSettings)
    python: str = Field("python3", description="Interpreter in the base image used to create /opt/venv.")
    profile: Literal["default", "skypilot"] = Field("default", description=(
        "default: the image every target runs; skypilot: that image plus what SkyPilot's pod setup needs "
        "(sudo for the image's user, curl, rsync, sshd, uv), one small layer on top."))


class RegistrySettings(_Strict):
    address: str = "127.0.0.1:5000"
    start_local: bool = True
    data_dir: str = ".registry"
    retries: int = Field(3, ge=0, le=100)
    retry_backoff_s: float = Field(2.0, ge=0, le=3600)
    stall_timeout_s: float = Field(300, gt=0, le=86400, description="A push whose stream says nothing this long is retried.")


class DeploySettings(_Strict):
    """Defaults of `invoke deploy`; the job's values are validated again as a JobSpec (deploy/job.py)."""
    name: str = Field("", description="The job's name; empty: the project's name.")
    target: str = "local"
    nodes: int = Field(3, ge=1, le=MAX_NODES, description="Head + workers.")
    cpus_per_node: int = Field(2, ge=1, le=MAX_CPUS_PER_NODE)
    memory: Optional[str] = Field(None, description=(
        "Memory per node, e.g. 64G (sbatch --mem, a pod's memory request, SkyPilot's memory); checked as the job's."))
    command: list[str] = Field(default_factory=lambda: ["python", "train.py"], description=(
        "The driver: it runs on the head, in the image's copy of project.app_dir."))
    port_base: int = Field(DEFAULT_PORT_BASE, ge=1024, le=65535)
    time_limit: str = "01:00:00"
    env: dict[str, str] = Field(default_factory=dict, description=(
        "Environment variables every process of the job gets (deploy --env adds to them). Not for secrets: "
        "they are written into the job's artifacts."))


def _path_text(value: str) -> str:
    """A path setting: relative to the project or absolute, never empty or blank (an empty build_dir
    was the project root itself), one line, no control characters."""
    if not value.strip():
        raise ValueError("empty or blank; give a path, relative to the project or absolute")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"{value[:80]!r} holds a control character (a newline?); give the path on one line")
    return value


PathText = Annotated[str, Field(max_length=4096), AfterValidator(_path_text)]


class ProjectSettings(_Strict):
    name: str = Field("", max_length=200, description=(
        "Names the project's images and jobs; empty: [project] name of its pyproject.toml, else its directory's name."))
    spec: PathText = "cluster_specs/local.json"
    app_dir: PathText = Field(".", description="The training code: the image's /app/project, where the driver runs.")
    runtime_dir: str = Field("", max_length=4096, description=(
        "The in-image runtime package copied into the app layer; empty: the one installed with the toolchain."))
    requirements: list[PathText] = Field(default_factory=list, description=(
        "The code's requirements: requirements files (hashes honoured), a pyproject.toml (its [project] "
        "dependencies), uv.lock or pylock.toml; the runtime's own are added."))
    build_dir: PathText = "build"


class Settings(_Strict):
    root: Path
    project: ProjectSettings = Field(default_factory=ProjectSettings)
    image: ImageSettings = Field(default_factory=ImageSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    quiet: bool = False

    def path(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.root / p

    @property
    def build_dir(self) -> Path:
        return self.path(self.project.build_dir)

    @property
    def runtime_dir(self) -> Path:
        """The runtime package the image carries: project.runtime_dir, else the installed one."""
        if self.project.runtime_dir:
            return self.path(self.project.runtime_dir)
        import runtime
        return Path(runtime.__file__).resolve().parent


def _plain(obj: Any) -> Any:
    """Invoke's DataProxy -> plain dicts/lists."""
    if hasattr(obj, "items"):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def defaults() -> dict:
    """The project's defaults as Invoke configuration (the collection's, so INVOKE_* can override them)."""
    return Settings(root=Path(".")).model_dump(mode="json", exclude={"root"})


def scratch_settings(root: Path, workdir: Path, app_dir: Path, spec: Path, registry: dict,
                     runtime_dir: Optional[Path] = None, repository: Optional[str] = None) -> Settings:
    """Settings for a project whose code is APP_DIR (with its requirements.txt) and whose build directory
    is WORKDIR/build (tests and benchmarks build such copies of the example), with the image defaults;
    REPOSITORY names its base and stage images (image.repository). Its wheels are the user cache's
    (toolchain/cache.py), as every project's."""
    d = defaults()
    build_dir = workdir / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    return Settings(
        root=root,
        project=ProjectSettings(name="example", spec=str(spec), app_dir=str(app_dir), build_dir=str(build_dir),
                                runtime_dir=str(runtime_dir or app_dir.parent / "runtime"),
                                requirements=[str(app_dir / "requirements.txt")]),
        image=ImageSettings(**{**d["image"], **({"repository": repository} if repository else {})}),
        registry=RegistrySettings(**registry),
        deploy=DeploySettings(name="example", command=["python", "train.py", "--cpus-per-worker", "0.5"]),
    )


def check_env(environ: dict, tree: Optional[dict] = None, prefix: str = "INVOKE") -> tuple[list[str], dict[str, str]]:
    """INVOKE_* variables read the way the settings are: (problems, rewrites).

    Invoke casts them itself, after tasks.py is imported: `int()` takes '٣' and '1_0', `float()`
    takes 'nan', a list-valued setting crashes it, and any boolean text but '0' and '' is True
    (so 'false' would mean True). Problems are one line per variable with the fix; rewrites are the
    booleans spelled as Invoke reads them ('1' or '0'), for the caller to put into the environment.
    """
    tree = defaults() if tree is None else tree
    problems: list[str] = []
    rewrites: dict[str, str] = {}
    for key, value in tree.items():
        var = f"{prefix}_{key.upper()}"
        if isinstance(value, dict):
            if var in environ:  # Invoke would ignore it without a word
                problems.append(f"{var}: {key} is a group of settings, not one value; set each of its settings "
                                f"({var}_<NAME>), or the group in the project's settings file")
            more, fixed = check_env(environ, value, var)
            problems += more
            rewrites.update(fixed)
        elif var in environ:
            given = environ[var]
            try:
                if isinstance(value, list):
                    problems.append(f"{var}: {key} is a list, which Invoke cannot read from the environment; "
                                    "set it in an invoke.yaml of the project instead")
                elif isinstance(value, bool):
                    rewrites[var] = "1" if numbers.boolean(given, var) else "0"
                elif isinstance(value, int):
                    numbers.whole(given, var, 0, 10**15)
                elif isinstance(value, float):
                    numbers.finite(given, var, -1e15, 1e15)
            except InputError as e:
                problems.append(str(e))
    return problems, rewrites


class ProjectPlace(Protocol):
    """Where a project is (toolchain/project.py's Located): its root, and its name from a setting."""
    root: Path

    def name(self, setting: str = "") -> str: ...


def load_settings(config: Any, located: ProjectPlace) -> Settings:
    """The validated settings of the project LOCATED (toolchain/project.py): Invoke's merged configuration,
    its paths relative to the project's root, its name and its job's name resolved."""
    data = {k: _plain(config.get(k)) for k in ("project", "image", "registry", "deploy") if config.get(k) is not None}
    try:
        data["quiet"] = numbers.boolean(config.get("quiet", False), "quiet")
    except InputError as e:
        raise ConfigError(f"invalid toolchain configuration: {e}") from None
    try:
        settings = Settings(root=located.root, **data)
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
        raise ConfigError("invalid toolchain configuration (invoke.yaml, INVOKE_* variables):\n  - " + "\n  - ".join(lines)) from None
    for v in settings.image.variants:
        if v not in VARIANTS:
            raise ConfigError(f"image.variants: unknown variant {v!r}; use one of {', '.join(VARIANTS)}")
        if v not in settings.image.torch:
            raise ConfigError(f"image.torch.{v}: missing; give the torch requirement for variant {v!r}")
    name = located.name(settings.project.name)
    project = settings.project.model_copy(update={"name": name})
    deploy = settings.deploy if settings.deploy.name else settings.deploy.model_copy(update={"name": name})
    return settings.model_copy(update={"project": project, "deploy": deploy})

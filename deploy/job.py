"""The job every target renders from: built once from the spec, the pushed image's record and the flags.

`JobSpec` holds only validated values (a DNS-1035 name, bounded counts, an `ImageRef` pinned by
digest, absolute paths without characters that shells, `#SBATCH` lines or mounts would read
differently). `ImageInfo` is what deploy needs to know of the pushed image.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator

from runtime import contract as C
from runtime import numbers
# a job's nodes (head, workers and spares), a node's CPUs and GPUs: bounded once, in runtime/contract.py,
# where the launcher's flags read them too
from runtime.contract import MAX_CPUS_PER_NODE, MAX_GPUS_PER_NODE, MAX_NODES  # noqa: F401 (MAX_NODES: re-exported)
from runtime.errors import InputError
from runtime.imageref import ImageRef
from runtime.spec import Mount, describe_errors

# DNS-1035 label (Kubernetes Service names), short enough for "<name>-s<seed>-workers" and Slurm
JOB_NAME_RE = C.JOB_NAME_RE
IMAGE_WORKDIR = C.PROJECT_DIR  # the app layer's project directory (the user layer's WorkingDir: toolchain/image/user_layer.py)
TIME_RE = r"^([0-9]{1,4}-[0-9]{1,2}(:[0-9]{2}){0,2}|[0-9]{1,6}(:[0-9]{2}){0,2})$"
_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f%]")


class DeployError(InputError):
    """A pre-flight problem: nothing was written or started (exit 2)."""


class PreflightError(DeployError):
    """Every problem found before anything was written, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        self.artifacts = None  # a dry run's artifacts as they would be (deploy/plan.py), where they render
        super().__init__("pre-flight failed, nothing was written:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class ImageInfo:
    """The pushed image as deploy sees it (from build/images.json)."""
    ref: ImageRef                    # pinned by digest
    spec_sha256: str                 # the spec baked into it
    spec_file: str = ""
    user: str = ""                   # the image config's USER, e.g. "1000:1000"
    registry_scheme: str = "unknown"  # https | http | unknown
    profile: str = "default"          # the image's profile (runtime/contract.py PROFILES): skypilot adds sudo

    @property
    def uid_gid(self) -> tuple[Optional[int], Optional[int]]:
        return numeric_user(self.user)


def numeric_user(user: str) -> tuple[Optional[int], Optional[int]]:
    """An image config's User ('1000:1000', '1000', 'ray') -> (uid, gid); None where not numeric."""
    name, _, group = (user or "").partition(":")
    uid = int(name) if numbers.is_whole(name) else None
    gid = int(group) if numbers.is_whole(group) else (uid if not group else None)
    return uid, gid


def time_limit_seconds(text: str) -> int:
    """Slurm's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]




class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True)

    name: str = Field(..., pattern=JOB_NAME_RE,
                      description="Job name: a DNS-1035 label (lowercase letter first, then letters, digits, '-'; <= 40).")
    nodes: int = Field(..., ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE)
    cpus_per_node: int = Field(..., ge=1, le=MAX_CPUS_PER_NODE)
    image: Optional[ImageRef] = Field(None, description="Pinned image; None = the nodes' own environment (plain sbatch).")
    image_info: Optional[ImageInfo] = None
    command: list[str] = Field(..., min_length=1, max_length=1000)
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    port_base: int = Field(C.DEFAULT_PORT_BASE, ge=1024, le=C.PORTABLE_EPHEMERAL_LOW - 111)
    time_limit: str = Field("01:00:00", pattern=TIME_RE, description="Slurm time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]].")
    retries: int = Field(0, ge=0, le=100)
    memory: Optional[str] = Field(None, pattern=r"^[1-9][0-9]{0,6}[KMGT]?$", description="Memory per node, e.g. 64G.")
    shm_size: str = Field("2g", pattern=r"^[1-9][0-9]{0,6}[kmgKMG]?$")
    fileroot: str = "/tmp/raytrain"
    workdir: Optional[str] = Field(None, description="Directory the command runs in (absolute); None = the image's.")
    serve: bool = Field(False, description="A held cluster (invoke up): the head serves drivers instead of running one.")

    @field_validator("workdir", "fileroot")
    @classmethod
    def _absolute(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v[:200]!r}")
        if _UNSAFE_PATH.search(v):
            raise ValueError(f"{v[:200]!r} contains a control character or '%' (Slurm expands % in log paths)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", k):
                raise ValueError(f"environment variable name {k[:60]!r} is not valid (letters, digits, '_')")
            if "\x00" in val:
                raise ValueError(f"environment variable {k}: the value contains NUL")
        return v

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: list[str]) -> list[str]:
        if any("\x00" in a for a in v):
            raise ValueError("an argument contains NUL, which no exec can pass")
        if v and v[0].startswith("-"):  # it would follow a scheduler tool's own options, and be read as one
            raise ValueError(f"{v[0][:40]!r} is an option, not a program: the command starts with the program to run")
        return v

    @field_serializer("image")
    def _image_text(self, v: Optional[ImageRef]) -> Optional[str]:
        return v.docker() if v else None

    @field_serializer("image_info")
    def _info_text(self, v: Optional[ImageInfo]) -> Optional[dict]:
        return None if v is None else {"spec_sha256": v.spec_sha256, "spec_file": v.spec_file, "user": v.user,
                                       "registry_scheme": v.registry_scheme, "profile": v.profile}

    @property
    def uid_gid(self) -> tuple[Optional[int], Optional[int]]:
        return self.image_info.uid_gid if self.image_info else (None, None)

    @property
    def variant(self) -> str:
        return job_variant(self.gpus_per_node)

    def launch(self, port_stride: int = 0) -> C.LaunchArgs:
        return C.LaunchArgs(port_base=self.port_base, num_cpus=self.cpus_per_node, num_gpus=self.gpus_per_node,
                            port_stride=port_stride)

    def launch_argv(self, port_stride: int = 0, driver: bool = False) -> list[str]:
        """How a node of this job starts; `driver=True`: the head, with the job's command after `--`
        (or, for a held cluster, `--serve` and no command)."""
        return C.launch_argv(self.launch(port_stride), list(self.command) if driver else None, serve=self.serve)


def job_variant(gpus_per_node: int) -> str:
    return "gpu" if gpus_per_node else "cpu"


def make_job(**values) -> JobSpec:
    """A JobSpec, or a DeployError whose lines name each bad value (as flags/fields) and the fix."""
    try:
        return JobSpec(**values)
    except ValidationError as e:
        raise PreflightError(describe_errors(e, JobSpec)) from None

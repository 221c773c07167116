"""The job description every target renders from: built once from the spec, build/images.json and flags."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.spec import ClusterSpec, Mount, describe_errors

JOB_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"
IMAGE_WORKDIR = "/opt/app/project"  # the app layer's project directory (dockerfiles/deps.Dockerfile.j2 WORKDIR)
TIME_RE = r"^(\d+-\d{1,2}(:\d{2}){0,2}|\d+(:\d{2}){0,2})$"


class DeployError(ValueError):
    """A pre-flight problem: nothing was written or started."""


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=JOB_NAME_RE, description="Job name: lowercase letters, digits and '-'.")
    nodes: int = Field(3, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_node: int = Field(2, ge=1)
    image: Optional[str] = Field(None, description="Image pinned by digest (repo@sha256:...); None = the host's environment (plain sbatch).")
    command: list[str] = Field(..., min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    port_base: int = Field(20000, ge=1024, le=60000)
    time_limit: str = Field("01:00:00", pattern=TIME_RE, description="Slurm time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]].")
    retries: int = Field(0, ge=0, le=100)
    memory: Optional[str] = Field(None, pattern=r"^[1-9][0-9]*[KMGT]?$", description="Memory per node, e.g. 64G.")
    shm_size: str = "2g"
    fileroot: str = "/tmp/raytrain"
    workdir: Optional[str] = Field(None, description="Directory the command runs in (absolute); None = the image's.")
    uid: Optional[int] = Field(None, ge=0, description="The image's numeric USER uid (pods run as it); None = unknown.")
    gid: Optional[int] = Field(None, ge=0, description="The image's numeric USER gid (pods' runAsGroup and fsGroup).")

    @field_validator("workdir", "fileroot")
    @classmethod
    def _absolute(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"environment variable name {k!r} is not valid (letters, digits, '_')")
        return v


RUNTIME_CMD = ("python", "-m", "runtime")


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


def numeric_user(user: str) -> tuple[Optional[int], Optional[int]]:
    """An image config's User ('1000:1000', '1000', 'ray') -> (uid, gid); None where not numeric."""
    name, _, group = (user or "").partition(":")
    uid = int(name) if name.isdigit() else None
    gid = int(group) if group.isdigit() else (uid if not group else None)
    return uid, gid


def launch_argv(job: JobSpec, port_stride: int = 0) -> list[str]:
    """How every node of the job starts (the driver command goes after `--` on the head)."""
    argv = [*RUNTIME_CMD, "launch", f"--port-base={job.port_base}", f"--num-cpus={job.cpus_per_node}"]
    if port_stride:
        argv.append(f"--port-stride={port_stride}")
    if job.gpus_per_node:
        argv.append(f"--num-gpus={job.gpus_per_node}")
    return argv


def image_record(images: dict, variant: str, images_file: Path) -> dict:
    """The push record (build/images.json) of the variant's image."""
    entry = images.get(variant)
    if not entry or "@sha256:" not in entry.get("repo_digest", ""):
        raise DeployError(f"no pushed {variant} image in {images_file}; run `invoke build push` first")
    return entry


def job_variant(gpus_per_node: int) -> str:
    return "gpu" if gpus_per_node else "cpu"


def build_job(spec: ClusterSpec, images: dict, images_file: Path, *, name: str, nodes: int, command: list[str],
              env: Optional[dict] = None, gpus_per_node: Optional[int] = None, cpus_per_node: int = 2,
              time_limit: str = "01:00:00", retries: int = 0, port_base: int = 20000,
              workdir: Optional[str] = None, memory: Optional[str] = None, needs_image: bool = True) -> JobSpec:
    """needs_image=False: the job runs in the nodes' own environment (plain sbatch), no image."""
    gpus = gpus_per_node if gpus_per_node is not None else (spec.slurm.gpus_per_node if spec.slurm else 0)
    record = image_record(images, job_variant(gpus), images_file) if needs_image else {}
    uid, gid = numeric_user(record.get("user", ""))
    try:
        return JobSpec(name=name, nodes=nodes, gpus_per_node=gpus, cpus_per_node=cpus_per_node,
                       image=record.get("repo_digest"), command=command, env=env or {},
                       mounts=spec.mounts, port_base=port_base, time_limit=time_limit, retries=retries,
                       fileroot=spec.fileroot, workdir=workdir, memory=memory, uid=uid, gid=gid)
    except ValidationError as e:
        raise DeployError("invalid job:\n  - " + "\n  - ".join(describe_errors(e, JobSpec))) from None

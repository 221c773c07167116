"""The job description every target renders from: built once from the spec, build/images.json and flags."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.spec import ClusterSpec, Mount, describe_errors

JOB_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"


class DeployError(ValueError):
    """A pre-flight problem: nothing was written or started."""


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=JOB_NAME_RE, description="Job name: lowercase letters, digits and '-'.")
    nodes: int = Field(3, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_node: int = Field(2, ge=1)
    image: str = Field(..., description="Image pinned by digest (repo@sha256:...) or a local tag for local runs.")
    command: list[str] = Field(..., min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    port_base: int = Field(20000, ge=1024, le=60000)
    time_limit: str = "01:00:00"
    retries: int = Field(0, ge=0)
    shm_size: str = "2g"
    fileroot: str = "/tmp/raytrain"

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"environment variable name {k!r} is not valid (letters, digits, '_')")
        return v


def image_for(images: dict, variant: str, images_file: Path) -> str:
    entry = images.get(variant)
    if not entry or "@sha256:" not in entry.get("repo_digest", ""):
        raise DeployError(f"no pushed {variant} image in {images_file}; run `invoke build push` first")
    return entry["repo_digest"]


def build_job(spec: ClusterSpec, images: dict, images_file: Path, *, name: str, nodes: int, command: list[str],
              env: Optional[dict] = None, gpus_per_node: Optional[int] = None, cpus_per_node: int = 2,
              time_limit: str = "01:00:00", retries: int = 0, port_base: int = 20000) -> JobSpec:
    gpus = gpus_per_node if gpus_per_node is not None else (spec.slurm.gpus_per_node if spec.slurm else 0)
    variant = "gpu" if gpus else "cpu"
    try:
        return JobSpec(name=name, nodes=nodes, gpus_per_node=gpus, cpus_per_node=cpus_per_node,
                       image=image_for(images, variant, images_file), command=command, env=env or {},
                       mounts=spec.mounts, port_base=port_base, time_limit=time_limit, retries=retries,
                       fileroot=spec.fileroot)
    except ValidationError as e:
        raise DeployError("invalid job:\n  - " + "\n  - ".join(describe_errors(e, JobSpec))) from None

"""What a held cluster's record keeps for its target (build/clusters.json `handle`), typed and checked
when read, like the spec: every field has its kind's pattern, and nothing else is kept.

These values reach scheduler tools as arguments (`scancel JOB`, `srun -w NODE`, `kubectl exec -n NS POD`,
`sky down NAME`, a container's name to remove). A record is a file anyone with the checkout can edit,
so a value that could be read as an option (`--user=root`, `-a`), a list separator (`,LD_PRELOAD=`) or
another object (the network `host`) is refused here, naming the field, before any tool runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from runtime import contract as C
from deploy import hint
from deploy.job import MAX_NODES
from runtime.errors import InputError

JOB_ID = r"^[0-9]{1,12}$"                                      # Slurm and SkyPilot job ids: digits
SLURM_NODE = r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$"              # a host name: never a leading '-'
ABS_PATH = r"^/[^\x00-\x1f\x7f]{0,4095}$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
POD_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
DOCKER_NAME = r"^[a-z0-9][-a-z0-9]{0,127}$"                    # what the local target names its objects
SKY_CLUSTER = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"


@dataclass(frozen=True)
class ClusterStatus:
    """A held cluster as its scheduler sees it now: whether its head runs, and each node's (or the job's)
    state by the name the scheduler knows it by."""
    up: bool
    nodes: dict[str, str]


class Handle(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def as_json(handle: object) -> object:
    """A handle as clusters.json keeps it (a model's fields, unset ones left out)."""
    return handle.model_dump(exclude_none=True) if isinstance(handle, Handle) else handle


class SlurmHandle(Handle):
    job_id: str = Field(..., pattern=JOB_ID)
    head_node: str = Field(..., pattern=SLURM_NODE)
    log: str = Field(..., pattern=ABS_PATH)
    job_name: str = Field(..., pattern=C.JOB_NAME_RE)
    container: Optional[str] = Field(None, pattern=r"^raytrain-head-[0-9]{1,12}$")  # Pyxis only


class K8sHandle(Handle):
    namespace: str = Field(..., pattern=DNS_LABEL)
    job_name: str = Field(..., pattern=C.JOB_NAME_RE)
    head_pod: str = Field(..., pattern=POD_NAME)


class SkyHandle(Handle):
    cluster: str = Field(..., pattern=SKY_CLUSTER)
    job_id: str = Field(..., pattern=JOB_ID)
    nodes: int = Field(..., ge=1, le=MAX_NODES)
    job_name: str = Field(..., pattern=C.JOB_NAME_RE)


class LocalHandle(Handle):
    network: str = Field(..., pattern=DOCKER_NAME)
    head: str = Field(..., pattern=DOCKER_NAME)
    containers: list[str] = Field(..., min_length=1, max_length=10_000)
    aliases: list[str] = Field(..., max_length=10_000)

    @model_validator(mode="after")
    def _names(self, info: ValidationInfo) -> "LocalHandle":
        job = (info.context or {}).get("name")
        for name in (self.network, *self.containers, *self.aliases):
            if not re.fullmatch(DOCKER_NAME, name) or (job and not name.startswith(f"{job}-")):
                raise ValueError(f"{name[:80]!r} is not a name the local target gives cluster {job!r}'s network "
                                 f"and containers ({job}-...)")
        if self.head not in self.containers:
            raise ValueError(f"the head {self.head!r} is not one of the cluster's containers")
        return self


def check(model: type[Handle], raw: object, where: str, name: str | None = None) -> Handle:
    """RAW (a record's dict, or a handle a target made) as MODEL (a target's `handle`), which the held
    modules take, of the cluster NAME (the local target's objects are named after it); InputError naming
    the field."""
    if isinstance(raw, Handle):
        raw = raw.model_dump(exclude_none=True)
    try:
        return model.model_validate(raw, context={"name": name})
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "handle"
        raise InputError(f"{where}: handle.{field}: {err['msg']} (got {str(err.get('input'))[:80]!r}); it is written "
                         f"by `{hint.cmd('up')}`: correct it, or delete that entry (what the cluster runs is then yours to "
                         "end)") from None

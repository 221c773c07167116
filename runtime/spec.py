"""The cluster spec: one typed model shared by the build toolchain and the in-image runtime.

The first nine fields are the seed format (ReaL's ``cluster_config.json``) verbatim, so an
existing spec of that format loads unchanged. The optional ``registry``, ``slurm`` and
``kubernetes`` sections extend it for the other deploy targets.

Loading never raises a raw pydantic error at a user: :func:`load_spec` turns every problem
into a :class:`SpecError` whose lines name the field path, the bad value and the fix.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class SpecError(ValueError):
    """A cluster spec that cannot be used; ``problems`` holds one line per bad field."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid cluster spec {source}:\n" + "\n".join(f"  - {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mount(_Strict):
    source: str
    target: str
    options: Optional[str] = None

    def as_string(self) -> str:
        return ":".join(p for p in (self.source, self.target, self.options) if p)


class SlurmOptions(_Strict):
    partition: Optional[str] = Field(None, description="Slurm partition (sbatch --partition).")
    account: Optional[str] = Field(None, description="Slurm account (sbatch --account).")
    pyxis: bool = Field(True, description="Run steps in containers through Pyxis (srun --container-image).")
    env_setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before srun on clusters without containers (module load, venv activation).",
    )
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node requested with --gpus-per-node.")


class KubernetesOptions(_Strict):
    namespace: str = Field(..., pattern=NAME_RE, description="Namespace the job's objects are created in.")
    fileroot_claim: Optional[str] = Field(
        None, description="PersistentVolumeClaim mounted at fileroot on every pod."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector for every pod.")
    image_pull_secret: Optional[str] = Field(None, description="Name of an existing docker-registry Secret.")
    gpus_per_pod: int = Field(0, ge=0, description="nvidia.com/gpu limit per pod.")


class ClusterSpec(_Strict):
    cluster_type: Literal["slurm", "kubernetes", "local"] = Field(
        ..., description="Scheduler the cluster runs: slurm, kubernetes or local (Docker engine)."
    )
    cluster_name: str = Field(..., min_length=1, description="Name of the cluster. Arbitrary.")
    fileroot: str = Field(..., description="Absolute path shared by all nodes for logs and checkpoints.")
    default_mount: str = Field(
        "", description="Comma-separated src:dst[:opts] mounts for every node; should include fileroot."
    )
    node_type_from_node_name: dict[str, str] = Field(
        default_factory=dict, description="Regular expression on the host name -> node type (g1, g8, a100, ...)."
    )
    gpu_type_from_node_name: dict[str, str] = Field(
        default_factory=dict, description="Regular expression on the host name -> GPU type as Slurm knows it."
    )
    cpu_image: str = Field(..., min_length=1, description="Image for the head (driver) and CPU-only nodes.")
    gpu_image: str = Field(..., min_length=1, description="Image for GPU worker nodes.")
    node_name_prefix: str = Field(
        "", description="Host names are this prefix followed by an integer, e.g. 'com-' for com-01."
    )
    registry: Optional[str] = Field(
        None, description="Registry host[:port][/path] images are pushed to; overrides the toolchain default."
    )
    slurm: Optional[SlurmOptions] = None
    kubernetes: Optional[KubernetesOptions] = None

    @field_validator("fileroot")
    @classmethod
    def _absolute_fileroot(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path (starting with '/'), got {v!r}")
        return v

    @field_validator("default_mount")
    @classmethod
    def _valid_mounts(cls, v: str) -> str:
        for item in filter(None, (s.strip() for s in v.split(","))):
            parts = item.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]):
                raise ValueError(f"mount {item!r} is not of the form /src:/dst[:opts]")
            for p in parts[:2]:
                if not p.startswith("/"):
                    raise ValueError(f"mount {item!r}: {p!r} must be an absolute path")
        return v

    @field_validator("node_type_from_node_name", "gpu_type_from_node_name")
    @classmethod
    def _compile_regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"key {pattern!r} is not a valid regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _target_sections(self) -> "ClusterSpec":
        if self.cluster_type == "kubernetes" and self.kubernetes is None:
            raise ValueError("cluster_type 'kubernetes' needs a 'kubernetes' section with at least 'namespace'")
        return self

    @property
    def mounts(self) -> list[Mount]:
        out = []
        for item in filter(None, (s.strip() for s in self.default_mount.split(","))):
            parts = item.split(":")
            out.append(Mount(source=parts[0], target=parts[1], options=parts[2] if len(parts) == 3 else None))
        return out

    def node_type(self, hostname: str) -> Optional[str]:
        return _first_match(self.node_type_from_node_name, hostname)

    def gpu_type(self, hostname: str) -> Optional[str]:
        return _first_match(self.gpu_type_from_node_name, hostname)


def _first_match(table: dict[str, str], hostname: str) -> Optional[str]:
    for pattern, value in table.items():
        if re.match(pattern, hostname):
            return value
    return None


_FIXES = {
    "missing": "add this field",
    "literal_error": "use one of the allowed values",
    "extra_forbidden": "remove it",
    "string_type": "use a JSON string",
    "bool_type": "use true or false",
    "bool_parsing": "use true or false",
    "int_type": "use a whole number",
    "int_parsing": "use a whole number",
    "dict_type": "use a JSON object",
    "list_type": "use a JSON array",
    "string_pattern_mismatch": "use lowercase letters, digits and '-' (a DNS label)",
    "greater_than_equal": "use a number >= 0",
}


def _model_at(model: type[BaseModel], loc: tuple) -> Optional[type[BaseModel]]:
    """The pydantic model class whose field set applies at ``loc`` (for 'did you mean')."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def describe_errors(err: ValidationError, model: type[BaseModel] = ClusterSpec) -> list[str]:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) for p in loc) or "(top level)"
        kind = e["type"]
        value = e.get("input")
        if kind == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            names = list(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(names)}"
            lines.append(f"{path}: unknown key; {hint}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        shown = "" if kind in ("missing", "value_error") else f" (got {json.dumps(value, default=str)[:120]})"
        fix = _FIXES.get(kind)
        lines.append(f"{path}: {msg}{shown}" + (f"; {fix}" if fix and fix not in msg else ""))
    return lines


def parse_spec(data: Any, source: str = "<spec>") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(source, [f"(top level): must be a JSON object, got {type(data).__name__}"])
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, describe_errors(e)) from None


def load_spec(path: str | Path) -> ClusterSpec:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(str(path), [f"cannot read the file: {e.strerror}"]) from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SpecError(str(path), [f"not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"]) from None
    return parse_spec(data, str(path))


def spec_hash(path: str | Path) -> str:
    """sha256 of the spec file's bytes: the file baked into the image is this exact file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def json_schema() -> dict:
    schema = ClusterSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Cluster spec"
    return schema

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import re2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runtime import k8s_names, strict_json
from runtime.errors import InputError
from runtime.files import FileReadError, read_regular
from runtime.imageref import ImageRef, ImageRefError

MAX_SPEC_BYTES = 1 << 20
MAX_PATTERN_LENGTH = 1000
_PATH_BAD = re.compile(r"[\x00-\x1f\x7f,:%\s]")  # not in a path that goes into mounts, #SBATCH or YAML


class SpecError(InputError):
    """A cluster spec that cannot be used; ``problems`` holds one line per bad field."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid cluster spec {source}:\n" + "\n".join(f"  - {p}" for p in problems))


MAX_TEXT = 4096     # any one string of a spec
MAX_ENTRIES = 1000  # any one list or mapping of a spec
# Unicode categories no spec text may hold: controls (Cc: NUL, newline, ESC), format characters (Cf: bidi
# overrides, zero-width spaces) and line/paragraph separators (Zl, Zp): each makes a name read or print
# other than it is (a forged log line, a label that looks like another)
_BAD_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def _text_problem(value: str) -> Optional[str]:
    import unicodedata
    if len(value) > MAX_TEXT:
        return f"is {len(value)} characters long; at most {MAX_TEXT}"
    for ch in value:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return (f"contains {unicodedata.name(ch, 'a control character')} (U+{ord(ch):04X}), a control, format or line "
                    "separator character; use plain text")
    return None


def _check_texts(value: Any, path: str) -> None:
    """Every string, list and mapping under VALUE (a spec's raw input), bounded and free of _BAD_CATEGORIES."""
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem:
            raise ValueError(f"{path or 'value'} {problem}")
    elif isinstance(value, (list, dict)):
        if len(value) > MAX_ENTRIES:
            raise ValueError(f"{path or 'value'} has {len(value)} entries; at most {MAX_ENTRIES}")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_texts(key, f"{path}: key" if path else "key")
            _check_texts(item, f"{path}.{key}" if path else str(key))


class _Strict(BaseModel):
    # strict: true and "8" are not counts, 8 is not a string
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _texts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _check_texts(data, "")
        return data


class Mount(_Strict):
    source: str
    target: str
    options: Optional[str] = None

    def as_string(self) -> str:
        return ":".join(p for p in (self.source, self.target, self.options) if p)


# a Slurm partition or account name, from the spec or a flag (deploy/targets/slurm/ uses this one)
SLURM_NAME = r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$"  # not '-' first: it would read as an option


class SlurmOptions(_Strict):
    partition: Optional[str] = Field(None, pattern=SLURM_NAME, description="Slurm partition (sbatch --partition).")
    account: Optional[str] = Field(None, pattern=SLURM_NAME, description="Slurm account (sbatch --account).")
    pyxis: bool = Field(True, description="Run steps in containers through Pyxis (srun --container-image).")
    env_setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before srun on clusters without containers (module load, venv activation).",
    )
    gpus_per_node: int = Field(0, ge=0, le=1024, description="GPUs per node requested with --gpus-per-node.")


class KubernetesOptions(_Strict):
    namespace: str = Field(..., description="Namespace the job's objects are created in (a DNS-1123 label).")
    fileroot_claim: Optional[str] = Field(
        None, description="PersistentVolumeClaim mounted at fileroot on every pod."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector for every pod.")
    image_pull_secret: Optional[str] = Field(None, description="Name of an existing docker-registry Secret.")
    gpus_per_pod: int = Field(0, ge=0, le=1024, description="nvidia.com/gpu limit per pod.")
    pod_security: Literal["restricted", "privileged"] = Field(
        "restricted", description="The Pod Security level the pods are written for: 'restricted' (the default; "
        "no hostPath volumes) or 'privileged' (the spec's other mounts become hostPath volumes).")
    ephemeral_storage: str = Field(
        "4Gi", description="ephemeral-storage request per pod (logs, Ray's session files, the writable layer), "
        "so the scheduler places pods where the disk is, not the kubelet's eviction manager.")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        _k8s_rule(k8s_names.dns1123_label(v), "use a namespace name such as ml-training")
        return v

    @field_validator("fileroot_claim", "image_pull_secret")
    @classmethod
    def _object_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            _k8s_rule(k8s_names.dns1123_subdomain(v), "give the object's name as `kubectl get` lists it")
        return v

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            _k8s_rule(k8s_names.label_key(key) or k8s_names.label_value(value),
                      "node_selector holds node labels as `kubectl get nodes --show-labels` prints them")
        return v

    @field_validator("ephemeral_storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]{0,6}(Ki|Mi|Gi|Ti)", v):
            raise ValueError(f"{v[:40]!r} is not a quantity such as 4Gi or 500Mi (Ki, Mi, Gi or Ti)")
        return v


def _k8s_rule(problem: Optional[str], fix: str) -> None:
    """A kube-apiserver rule's outcome, raised as a validator's error with the fix."""
    if problem:
        raise ValueError(f"{problem}; {fix}")


class ClusterSpec(_Strict):
    cluster_type: Literal["slurm", "kubernetes", "local"] = Field(
        ..., description="Scheduler the cluster runs: slurm, kubernetes or local (Docker engine)."
    )
    cluster_name: str = Field(..., min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f\s](.*[^\x00-\x1f\x7f\s])?$",
                              description="Name of the cluster. Text on one line, not starting or ending with a space (it becomes an image label).")
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
        "", max_length=253, description="Host names are this prefix followed by an integer, e.g. 'com-' for com-01."
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
        bad = _PATH_BAD.search(v)
        if bad:
            raise ValueError(f"{v[:200]!r} contains {bad.group()!r}; use a plain path without spaces, ',', ':' or '%' "
                             "(Slurm expands % in log paths, mounts split on ',' and ':')")
        return v

    @field_validator("cpu_image", "gpu_image")
    @classmethod
    def _image_name(cls, v: str, info) -> str:
        try:
            ref = ImageRef.parse(v, info.field_name)
        except ImageRefError as e:
            raise ValueError(str(e).split(": ", 1)[1]) from None
        if ref.digest:
            raise ValueError(f"{v!r} has a digest; give a repository (and optionally a tag): the build makes the digest")
        return v

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        try:
            ref = ImageRef.parse(f"{v.rstrip('/')}/x", "registry")
        except ImageRefError:
            raise ValueError(f"{v[:200]!r} is not host[:port][/path] (no scheme such as http://, lowercase path)") from None
        if ref.registry is None:
            raise ValueError(f"{v!r} does not name a registry host (it needs a '.', a ':port' or localhost)")
        return v
    @field_validator("default_mount")
    @classmethod
    def _valid_mounts(cls, v: str) -> str:
        for item in filter(None, (s.strip() for s in v.split(","))):
            if re.search(r"[\x00-\x1f\x7f]", item):
                raise ValueError(f"mount {item[:200]!r} contains a control character")
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
            _compile(pattern)
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


def _compile(pattern: str):
    """Spec patterns run on every node against its host name: compiled with RE2, a linear-time engine,
    so no pattern (e.g. '(a+)+$') can make node-type detection hang."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"key {pattern[:60]!r}...: regular expression longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return _compiled(pattern)
    except Exception as e:  # re2.error, and RE2's limits on program size (e.g. a{100000})
        raise ValueError(f"key {pattern[:200]!r} is not a regular expression RE2 accepts ({_re2_reason(e)}); RE2 has no "
                         "backreferences or look-around, and bounds repetition counts at 1000") from None


_CACHE: dict[str, Any] = {}
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would also log the error through absl, with its start-up preamble


def _re2_reason(e: Exception) -> str:
    """RE2's reason as text (its error carries bytes)."""
    arg = e.args[0] if e.args else e
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def _compiled(pattern: str):
    if pattern not in _CACHE:
        _CACHE[pattern] = re2.compile(pattern, _RE2_OPTIONS)
    return _CACHE[pattern]


def _first_match(table: dict[str, str], hostname: str) -> Optional[str]:
    for pattern, value in table.items():
        if _compiled(pattern).match(hostname[:255]):
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
        if kind == "string_pattern_mismatch":  # the field's own description says what it takes, where it has one
            parent = _model_at(model, loc[:-1])
            field = parent.model_fields.get(loc[-1]) if parent and loc and isinstance(loc[-1], str) else None
            if field is not None and field.description:
                fix = f"expected: {field.description.rstrip('.')}"
        lines.append(f"{path}: {msg}{shown}" + (f"; {fix}" if fix and fix not in msg else ""))
    return lines


def parse_spec(data: Any, source: str = "<spec>") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(source, [f"(top level): must be a JSON object, got {type(data).__name__}"])
    data = {k: v for k, v in data.items() if k != "$schema"}  # editors' schema pointer, as the README suggests
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, describe_errors(e)) from None


@dataclass(frozen=True)
class LoadedSpec:
    """A spec file read once: where it is, its bytes, their sha256 and the spec validated from those same
    bytes. A command reads it at its start and passes it on; what the image bakes in, what its label
    says and what was validated are one version of the file, whatever happens to the file meanwhile."""
    path: Path
    raw: bytes
    sha256: str
    model: ClusterSpec


def read_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file; every way it can be wrong is a SpecError (exit 2), never a traceback."""
    path = Path(path)
    source = str(path)
    try:
        raw = read_regular(path, MAX_SPEC_BYTES)
    except FileNotFoundError:
        raise SpecError(source, ["cannot read the file: No such file or directory"]) from None
    except FileReadError as e:
        raise SpecError(source, [f"the file {e}; give the spec's JSON file"]) from None
    return LoadedSpec(path, raw, hashlib.sha256(raw).hexdigest(), _parse_bytes(raw, source))


def load_spec(path: str | Path) -> ClusterSpec:
    """The validated spec of a file (`read_spec`'s model)."""
    return read_spec(path).model


def _parse_bytes(raw: bytes, source: str) -> ClusterSpec:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(source, [f"not UTF-8 (byte {e.start}): save the spec as UTF-8 JSON"]) from None
    try:
        data = strict_json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(source, [f"not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"]) from None
    except strict_json.StrictJSONError as e:
        raise SpecError(source, [str(e)]) from None
    except (ValueError, RecursionError) as e:  # a 5000-digit number, nesting deeper than Python's stack
        raise SpecError(source, [f"not a usable JSON document: {str(e)[:200] or type(e).__name__}"]) from None
    return parse_spec(data, source)


def spec_hash(path: str | Path) -> str:
    """sha256 of a spec file's bytes as they are now, valid or not (what a build made from a LoadedSpec
    recorded is compared with it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def json_schema() -> dict:
    schema = ClusterSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Cluster spec"
    return schema

"""What was built (build/build.json), pushed (build/images.json) and deployed (build/runs.json):
typed records, one writer each.

`invoke build` writes BuildRecords (images.build_all), `invoke push` PushRecords (pipeline.push),
`invoke deploy` a RunRecord per job name (the run `--resume` continues);
everything else only reads them, through these functions, which refuse a malformed file with the
fix instead of failing later on a missing key. Writes are atomic: a crash leaves the old file.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError,
                      field_validator, model_validator)

from runtime import strict_json
from runtime.contract import JOB_NAME_RE
from runtime.errors import InputError
from runtime.files import FileReadError, read_regular
from toolchain.atomic import write_atomic
from runtime.digest import Digest
from runtime.imageref import ImageRef, ImageRefError
from deploy import handles, hint
from deploy.targets import check_handle

SHA256 = r"^[0-9a-f]{64}$"

MAX_RECORDS = 16 << 20  # a build directory's record file (build/*.json): kilobytes in practice


def _ref(value: object, what: str, not_text: str) -> ImageRef:
    """VALUE as a reference, parsed once (runtime/imageref.py): an ImageRef as it is, text parsed (WHAT names it
    in the error); anything else refused with NOT_TEXT."""
    if isinstance(value, ImageRef):
        return value
    if not isinstance(value, str):
        raise ValueError(not_text)
    try:
        return ImageRef.parse(value, what)
    except ImageRefError as e:
        raise ValueError(str(e)) from None


def _tagged(value: object) -> ImageRef:
    """A local image's reference: repository:tag, no digest."""
    ref = _ref(value, "image", "an image reference is text (repository:tag)")
    if ref.tag is None or ref.digest is not None:
        raise ValueError(f"{ref.docker()[:120]!r}: a built image is named repository:tag")
    return ref


# an image reference in a record: typed in Python, its text (`docker` form) in the JSON file
TaggedRef = Annotated[ImageRef, BeforeValidator(_tagged), PlainSerializer(ImageRef.docker, return_type=str)]


def _pinned_ref(value: object, what: str = "repo_digest") -> ImageRef:
    """A reference pinned by digest (registry/repository@sha256:...); WHAT names it in the error."""
    ref = _ref(value, what, f"{what}: an image reference is text (registry/repository@sha256:...)")
    try:
        return ref.require_pinned()
    except ImageRefError as e:
        raise ValueError(str(e)) from None


def _pinned(value: str, what: str = "image") -> str:
    """A reference pinned by digest, kept as its text (`_pinned_ref` checks it)."""
    _pinned_ref(value, what)
    return value


def _pinned_or_none(value: str) -> str:
    """What a job ran: a reference pinned by digest, or "" (plain Slurm: the nodes' own environment)."""
    return _pinned(value) if value else value


PinnedRef = Annotated[ImageRef, BeforeValidator(_pinned_ref), PlainSerializer(ImageRef.docker, return_type=str)]


def _stage_ref(value: object) -> Optional[ImageRef]:
    """An image a build stands on: a local one (repository:tag), or the registry's (pinned by digest); None
    where there is none (null, or "" and "-" as older files wrote it)."""
    if value is None or value in ("", "-"):
        return None
    return _ref(value, "a stage of the build",
                "an image reference is text (repository:tag, or registry/repository@sha256:...)")


StageRef = Annotated[Optional[ImageRef], BeforeValidator(_stage_ref),
                     PlainSerializer(lambda r: None if r is None else r.docker(), return_type=Optional[str])]

# values `status` prints: checked when read, so a damaged file prints no escape sequence or stray line
RanImage = Annotated[str, AfterValidator(_pinned_or_none)]
STARTED = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"  # toolchain/job_inputs.py `now`


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class BuildRecord(_Record):
    variant: str
    local_ref: TaggedRef
    human_ref: TaggedRef
    image_id: str
    spec_sha256: str = Field(..., pattern=SHA256)
    # the images below it, bottom first: where a push reads layers the layer store lacks (`stages`)
    base_ref: StageRef = None   # the base: a local image, or (built with no engine) the registry's, pinned
    user_ref: StageRef = None   # the user stage (an engine's build)
    deps_ref: StageRef = None
    app_ref: StageRef = None
    torch_source: str
    rebuilt: list[str] = Field(default_factory=list)
    # what the layers were made from, so a held cluster can tell a code change (run ships it) from a
    # change below the code (a redeploy): toolchain/held.py
    below_app_key: str = ""      # requirements, base, torch and image settings
    runtime_sha256: str = ""     # the runtime package (tree hash, as the app layer's key uses it)
    code_sha256: str = ""        # the project's code (project.app_dir)
    # False: built with no engine (toolchain/image/registry_build.py): the image is its config and new layers in
    # the layer store, the rest in the registry it is pushed to; nothing of it is in a local engine
    engine: bool = True

    @model_validator(mode="after")
    def _registry_base_pinned(self) -> "BuildRecord":
        if not self.engine and (self.base_ref is None or not self.base_ref.pinned):
            raise ValueError("base_ref: a build with no engine records the image it stood on in the registry, "
                             "pinned by digest (registry/repository@sha256:...)")
        return self

    def stages(self) -> list[ImageRef]:
        """The images below it that this build recorded, bottom first."""
        return [r for r in (self.base_ref, self.user_ref, self.deps_ref) if r is not None]


class PushRecord(_Record):
    local_ref: TaggedRef
    image_id: str
    repo_digest: PinnedRef
    digest: Annotated[str, AfterValidator(lambda v: Digest(v, "digest"))]
    spec_sha256: str = Field(..., pattern=SHA256)
    spec_file: str = ""
    registry: str
    registry_scheme: str = Field("unknown", pattern=r"^(https|http|unknown)$")
    tags: list[str] = Field(default_factory=list)
    user: str = ""
    profile: str = Field("default", pattern=r"^[a-z]{1,20}$")  # the image's profile label (runtime/contract.py)

    @property
    def ref(self) -> ImageRef:
        return self.repo_digest


RUN_ID = r"^[a-z][-a-z0-9]{0,79}$"


class RunRecord(_Record):
    """One deploy = one run: its id names the checkpoints; a scheduler's restart keeps it."""
    run_id: str = Field(..., pattern=RUN_ID)
    target: str
    image: RanImage = ""
    started: str = Field(..., pattern=STARTED)
    code_sha256: str = ""  # `invoke run` on a held cluster: the code it sent (the image holds the rest)


_FLAG = re.compile(r"--[a-z][a-z0-9-]{0,40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _words_of(value: object) -> object:
    """A record written before the words were kept apart holds them as one shell-quoted string."""
    if isinstance(value, str):
        import shlex
        try:
            return shlex.split(value)
        except ValueError as e:
            raise ValueError(f"not shell words ({e})") from None
    return value


def _flag_words(words: list[str]) -> list[str]:
    """Flags, each followed by its value or by none: what `up` was given, never anything to run."""
    if len(words) > 200:
        raise ValueError(f"{len(words)} words; `up` takes far fewer")
    previous_flag = False
    for word in words:
        if _CONTROL.search(word) or len(word) > 4096:
            raise ValueError(f"{word[:40]!r} holds a control character or is too long")
        if _FLAG.fullmatch(word):
            previous_flag = True
        elif previous_flag and not word.startswith("-"):
            previous_flag = False
        else:
            raise ValueError(f"{word[:40]!r} is neither a flag of `up` nor a flag's value")
    return words


class ClusterRecord(_Record):
    """A held cluster (`invoke up`): what it runs, so that `invoke run` sends only code it can honour.
    Its handle is checked against its target's model when read (deploy/handles.py)."""
    name: str = Field(..., pattern=JOB_NAME_RE)
    target: str = Field(..., pattern=r"^[a-z0-9]{1,20}$")
    image: RanImage              # the pinned image every node runs
    variant: str
    spec_sha256: str = Field(..., pattern=SHA256)
    below_app_key: str
    runtime_sha256: str
    project: str                 # the project root that started it
    started: str = Field(..., pattern=STARTED)
    # the target's own (local: containers, network): typed by deploy/handles.py when read (read_clusters)
    handle: Annotated[Any, PlainSerializer(handles.as_json)] = Field(default_factory=dict)
    # the flags `up` was given beyond --target and --name, word by word (hints repeat them, each quoted)
    up_args: Annotated[list[str], BeforeValidator(_words_of), AfterValidator(_flag_words)] = Field(default_factory=list)


class LaunchRecord(_Record):
    """What `deploy --submit` launched under a job name on a target whose launches outlive the command
    (SkyPilot's clusters), written before each launch starts, so `destroy` removes exactly these."""
    target: str = Field(..., pattern=r"^[a-z0-9]{1,20}$")
    clusters: list[str] = Field(default_factory=list)

    @field_validator("clusters")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(JOB_NAME_RE, name):
                raise ValueError(f"{name[:60]!r} is not a cluster name this toolchain launches")
        return v


R = TypeVar("R", bound=_Record)


def build_file(build_dir: Path) -> Path:
    return build_dir / "build.json"


def images_file(build_dir: Path) -> Path:
    return build_dir / "images.json"


def _raw(path: Path, made_by: str) -> bytes | None:
    """The file's bytes (None: there is none); anything but a regular file of at most MAX_RECORDS bytes
    (a link, a directory, a FIFO: this toolchain writes none of them) is an InputError."""
    try:
        return read_regular(path, MAX_RECORDS, follow=False)
    except FileNotFoundError:
        return None
    except FileReadError as e:
        raise InputError(f"{path} {e}; it is written by `{made_by}`: remove it and run `{made_by}` again") from None


def _parse(raw: bytes | None, path: Path, model: type[R], made_by: str) -> dict[str, R]:
    if raw is None:
        return {}
    try:
        data = strict_json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return {str(k): model.model_validate(v) for k, v in data.items()}
    except (ValueError, ValidationError, RecursionError) as e:
        if isinstance(e, ValidationError):
            err = e.errors()[0]
            detail = f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"[:200]
        else:
            detail = str(e).splitlines()[0][:200]
        raise InputError(f"{path} is malformed ({detail}); it is written by `{made_by}`: delete it and run "
                         f"`{made_by}` again") from None


def _read(path: Path, model: type[R], made_by: str) -> dict[str, R]:
    return _parse(_raw(path, made_by), path, model, made_by)


def _replace(path: Path, data: bytes) -> None:
    """Write PATH whole or not at all, never through a link (toolchain.atomic)."""
    write_atomic(path, data)


def _write(path: Path, records: dict[str, _Record]) -> Path:
    _replace(path, (json.dumps({k: r.model_dump() for k, r in sorted(records.items())}, indent=2, sort_keys=True)
                    + "\n").encode())
    return path


def read_builds(build_dir: Path) -> dict[str, BuildRecord]:
    return _read(build_file(build_dir), BuildRecord, hint.cmd("build"))


def write_builds(build_dir: Path, built: list[BuildRecord]) -> Path:
    """Merge: `build --variant cpu` keeps the gpu record."""
    return _write(build_file(build_dir), {**read_builds(build_dir), **{b.variant: b for b in built}})


def read_pushes(build_dir: Path) -> dict[str, PushRecord]:
    return _read(images_file(build_dir), PushRecord, hint.cmd("push"))


def write_push(build_dir: Path, variant: str, record: PushRecord) -> Path:
    return _write(images_file(build_dir), {**read_pushes(build_dir), variant: record})


def runs_file(build_dir: Path) -> Path:
    return build_dir / "runs.json"


def read_runs(build_dir: Path) -> dict[str, RunRecord]:
    return _read(runs_file(build_dir), RunRecord, hint.cmd("deploy"))


def write_run(build_dir: Path, name: str, record: RunRecord) -> Path:
    return _write(runs_file(build_dir), {**read_runs(build_dir), name: record})


@dataclass(frozen=True)
class RunsBefore:
    """build/runs.json as it was before a run was recorded: its bytes (None: no file) and its records."""
    raw: bytes | None
    runs: dict[str, RunRecord]


def runs_before(build_dir: Path) -> RunsBefore:
    """build/runs.json, read once and checked before a run is recorded (a malformed file is refused
    before anything starts), for restore_run."""
    path = runs_file(build_dir)
    raw = _raw(path, hint.cmd("deploy"))
    return RunsBefore(raw, _parse(raw, path, RunRecord, hint.cmd("deploy")))


def restore_run(build_dir: Path, name: str, before: RunsBefore) -> None:
    """Put NAME's record back as it was BEFORE (runs_before) a run that failed or started nothing.
    When nothing else changed meanwhile, the file is left byte for byte as it was (or removed again)."""
    path = runs_file(build_dir)
    runs = {k: v for k, v in read_runs(build_dir).items() if k != name}
    if name in before.runs:
        runs[name] = before.runs[name]
    if runs != before.runs:  # another job's run was recorded meanwhile: keep it
        _write(path, runs)
    elif before.raw is None:
        path.unlink(missing_ok=True)
    else:
        _replace(path, before.raw)


def clusters_file(build_dir: Path) -> Path:
    return build_dir / "clusters.json"


def read_clusters(build_dir: Path) -> dict[str, ClusterRecord]:
    path = clusters_file(build_dir)
    out = {}
    for key, rec in _read(path, ClusterRecord, hint.cmd("up")).items():
        if key != rec.name:
            raise InputError(f"{path}: the record under {key[:40]!r} is named {rec.name!r}; it is written by "
                             f"`{hint.cmd('up')}`: correct it, or delete that entry")
        out[key] = rec.model_copy(update={"handle": check_handle(rec.target, rec.handle, f"{path} [{key}]",
                                                                        rec.name)})
    return out


def write_cluster(build_dir: Path, record: ClusterRecord) -> Path:
    check_handle(record.target, record.handle, f"the handle of {record.name!r} from its target",
                  record.name)  # readable back
    return _write(clusters_file(build_dir), {**read_clusters(build_dir), record.name: record})


def drop_cluster(build_dir: Path, name: str) -> None:
    _write(clusters_file(build_dir), {k: v for k, v in read_clusters(build_dir).items() if k != name})


def launches_file(build_dir: Path) -> Path:
    return build_dir / "launched.json"


def _launch_key(target: str, name: str) -> str:
    return f"{target}/{name}"


def read_launches(build_dir: Path, target: str, name: str) -> list[str]:
    """The clusters `deploy --submit --target TARGET --name NAME` launched and `destroy` has not removed."""
    record = _read(launches_file(build_dir), LaunchRecord, hint.cmd("deploy")).get(_launch_key(target, name))
    return list(record.clusters) if record else []


def add_launches(build_dir: Path, target: str, name: str, clusters: list[str]) -> None:
    records = _read(launches_file(build_dir), LaunchRecord, hint.cmd("deploy"))
    key = _launch_key(target, name)
    had = list(records[key].clusters) if key in records else []
    _write(launches_file(build_dir), {**records, key: LaunchRecord(target=target,
                                                                    clusters=list(dict.fromkeys(had + clusters)))})


def drop_launches(build_dir: Path, target: str, name: str, clusters: list[str]) -> None:
    records = _read(launches_file(build_dir), LaunchRecord, hint.cmd("deploy"))
    key = _launch_key(target, name)
    if key not in records:
        return
    left = [c for c in records[key].clusters if c not in clusters]
    rest = {k: r for k, r in records.items() if k != key}
    _write(launches_file(build_dir), {**rest, **({key: LaunchRecord(target=target, clusters=left)} if left else {})})

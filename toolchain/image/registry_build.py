"""A build with no Docker engine: the image a previous push left in the registry, or the base image.base_image
pins there, with the dependency layers this build's requirements change made again and the thin layers above.

Where no engine answers (a CI runner without one, no root, no cache), `build` reads the variant's image
under its human tag in the registry it is pushed to: its manifest and config (toolchain/image/previous_image.py)
and the provenance its config carries (toolchain/image/provenance.py). Then, without running anything:

  - the base and user layers are that image's bottom ones, by reference (never downloaded), when the user
    stage's key computed here is the one recorded (the same base and image user);
  - otherwise (no previous image, or another base or user) they are the base's, which image.base_image pins in
    the same registry (with none set, this project's own base there: `project_base`, where `base.publish`
    puts it), and a user layer written here from the base's /etc; the base's Python is read from its
    files (toolchain/image/registry_base.py) and the push mounts its layers from its repository;
  - uv resolves the requirement set; a wheel the previous image recorded (same name and version) is not
    downloaded; the others are, checked against the lock's hashes;
  - the layer plan (toolchain/image/venv_plan.py) is made from the recorded sizes and the new wheels', and each
    dependency layer whose key is the recorded one (the same wheels, sha256 for sha256, the same venv,
    Python and compiler) is taken as it is, its blob already in the registry; the others are written (the
    wheels of a group layer that changed are downloaded for it), their bytecode compiled on the host,
    which must write the bytecode the image's Python loads;
  - the venv's top layer, the app layer and the spec layer are written, and the config is the one the
    engine's stages make from the same inputs, so both ways give the same image ID.

The layers and the config go to the build's layer store, where `push` reads them; the registry gives the
rest. Anything that does not allow it (no previous image and no base in the registry, a base in another
registry, another Python, no provenance) is one line saying what and how to build instead; nothing is
written to the registry by `build`.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.utils import canonicalize_name, parse_wheel_filename

from deploy.registry.client import RegistryClient
from deploy.registry.errors import RegistryError, RegistryGone
from runtime.contract import SPEC_PATH as SPEC_ENV, VENV
from runtime.digest import Digest
from runtime.imageref import ImageRef
from runtime.spec import LoadedSpec
from toolchain.image import bytecode, layers, provenance, registry_base, venv_layer, venv_plan
from toolchain.publish.blobs import file_sha256
from toolchain.image.bootstrap import BaseImage, base_repository, bootstrap_key, external_key
from toolchain.config import Settings
from toolchain.image.deps_stage import DepsAssembly
from toolchain.errors import ToolchainError
from toolchain.image.images import (SPEC_PATH_IN_IMAGE, Builder, app_key, app_layer, config_fields, deps_key, image_labels,
                              image_names, layer_store, registry_address, source_keys, spec_file_layer, spec_key,
                              user_stage_config, user_stage_layer)
from toolchain.image.previous_image import HeldBlob, PreviousImageError, pair_layers
from toolchain.image.user_layer import UserLayerError
from toolchain.progress import Reporter, human_bytes
from toolchain.records import BuildRecord
from toolchain.image.venv_layer import Python
from toolchain.image.venv_plan import LayerIndex
from toolchain.wheels import pool_page, wheelhouse

TORCH_SOURCE_LABEL = "io.raytrain.torch-source"


class NoEngineBuildError(ToolchainError):
    """The build cannot be made without an engine from what the registry holds (the message says why and what to
    do; CAUSE, where given, says why alone: the line of a build that goes to the engine instead)."""

    def __init__(self, message: str, cause: str = ""):
        super().__init__(message)
        self.cause = cause or message


@dataclass(frozen=True)
class Previous:
    ref: ImageRef                      # registry/repository:tag, as asked for
    pinned: ImageRef                   # the image that tag named when it was read: registry/repository@sha256:...
    config: dict
    image_id: Digest                   # its config's digest
    held: dict[Digest, HeldBlob]       # its layers' blobs, by diff ID
    made_from: provenance.Provenance


def read_previous(reg: RegistryClient, ref: ImageRef, why: str) -> Optional[Previous]:
    """The image REF names in the registry, with its provenance; None when the registry has none;
    NoEngineBuildError saying what is wrong with one that is there."""
    where = ref.docker()
    try:
        found = reg.get_manifest(ref.tag)
        if found is None:
            return None
        manifest, media_type = found
        doc = json.loads(manifest)
        image_id = Digest(doc["config"]["digest"], "the config's digest")
        config_bytes = reg.get_small_blob(image_id, "the image config")
        if config_bytes is None:
            raise PreviousImageError("its config is not in the registry")
        held = pair_layers(manifest, media_type, config_bytes)
        config = json.loads(config_bytes)
        label = config.get(provenance.FIELD)
        if label is None:
            raise PreviousImageError(f"its config has no {provenance.FIELD} field (built before this tool wrote one, "
                                     "or its layer index was gone)")
        made_from = provenance.parse(label)
        ids, lower = config["rootfs"]["diff_ids"], made_from.lower_layers
        if [Digest(d) for d in ids[lower:lower + len(made_from.layers)]] != [l.diff_id for l in made_from.layers]:
            raise PreviousImageError(f"its {provenance.FIELD} field does not list the dependency layers its config has")
    except RegistryGone as e:
        raise NoEngineBuildError(f"{why}, and the registry of {where} is not reachable ({str(e)[:300]}); start it, or "
                                 "build where a Docker engine runs",
                                 f"no image to build on: the registry {ref.registry} is not running") from None
    except (PreviousImageError, provenance.ProvenanceError, RegistryError, ValueError, KeyError, TypeError,
            AttributeError) as e:
        raise NoEngineBuildError(f"{why}, and the image to build on, {where}, cannot be used: {str(e)[:300]}; build "
                                 "and push once where a Docker engine runs",
                                 f"{where} cannot be built on: {str(e)[:160]}") from None
    return Previous(ref, ref.at(Digest.of(manifest)), config, image_id, held, made_from)


def _base_key(settings: Settings, why: str) -> str:
    """The base's key as the engine's build computes it, without the engine."""
    configured = settings.image.base_image
    if not configured:
        return bootstrap_key(settings)
    ref = ImageRef.parse(configured, "image.base_image")
    if ref.registry is None or ref.digest is None:
        raise NoEngineBuildError(f"{why}; image.base_image {configured!r} must be pinned in a registry "
                                 "(registry/repository@sha256:...) to be used without one")
    reg = RegistryClient(ref.registry, ref.repository, 60)
    try:
        found = reg.get_manifest(ref.digest)
    except RegistryError as e:
        raise NoEngineBuildError(f"image.base_image {configured}: {e}") from None
    finally:
        reg.close()
    if found is None:
        raise NoEngineBuildError(f"image.base_image {configured}: the registry does not have it")
    try:
        return external_key(Digest(json.loads(found[0])["config"]["digest"], "its config's digest"))
    except (ValueError, KeyError, TypeError) as e:
        raise NoEngineBuildError(f"image.base_image {configured}: its manifest names no config ({str(e)[:120]}); "
                                 "give a single-platform image's digest") from None


def _lower_config(previous: Previous, label_keys: set) -> dict:
    """The user stage's config as the engine's stages pass it up: the previous image's, less what its top
    layer added (the spec's variable, this tool's labels)."""
    lower = layers.lower_of(previous.config)
    cfg = dict(lower["Config"])
    cfg["Env"] = [e for e in cfg.get("Env") or [] if e.split("=", 1)[0] != SPEC_ENV]
    cfg["Labels"] = {k: v for k, v in (cfg.get("Labels") or {}).items() if k not in label_keys}
    return {**lower, "Config": cfg}


@dataclass(frozen=True)
class Below:
    """What the dependency layers go on: the base's and the user's layers and the user stage's config."""
    diff_ids: list[str]
    config: dict                 # the user stage's, as the engine's inspect gives it (layers.image_config's lower)
    user_key: str
    python: Python
    compiler: list
    base: Optional[ImageRef]     # the base in the registry whose layers the push mounts; None: the previous image's


@dataclass
class _Wheels:
    files: list[str]                       # the set's wheel files, in name order
    fetched: list[str]                     # those downloaded by this build
    sha256: dict[str, str]                 # by file name
    sizes: dict[str, tuple[int, bool]]     # venv_plan.measure, by file name
    torch_source: str
    wanted: list                           # the requirement set (requirements.Requirement), for its hashes
    lock: dict                             # the resolution's wheel (download.WheelFile) of each pin, by file name
    read: set = field(default_factory=set)  # those whose sha256 and size are their bytes', not the record's


def build_variant(settings: Settings, variant: str, loaded: LoadedSpec, why: str, rep: Reporter) -> BuildRecord:
    """The variant's image on the registry's previous one, else on the base image.base_image pins in that
    registry (the module's docstring); its build record."""
    repo, human = image_names(loaded.model, variant, settings)
    target = ImageRef.parse(f"{registry_address(settings, loaded.model, variant)}/{repo}", "push target")
    reg = RegistryClient(target.registry, target.repository, settings.registry.stall_timeout_s)
    try:
        previous = read_previous(reg, ImageRef.parse(f"{target.name}:{human}", "previous image"), why)
    finally:
        reg.close()
    builder = Builder(None, settings, Reporter(quiet=True))  # its user stage key only: no engine is reached
    user_ref, user_key = builder.user_stage(BaseImage("", _base_key(settings, why), "", False))
    label_keys = set(image_labels(settings, loaded, variant, ""))
    store = layer_store(settings.build_dir)
    if previous is not None and previous.made_from.user_key == user_key:
        rep.step(f"build[{variant}]: without the engine, on {previous.ref.docker()} from the registry")
        below = _on_previous(previous, user_key, label_keys)
    elif settings.image.base_image:
        rep.step(f"build[{variant}]: without the engine, on the base {settings.image.base_image}"
                 + (f" (the base or the image's user changed since {previous.ref.docker()})" if previous else ""))
        below = _on_base(settings, target, user_key, store, why, rep,
                         ImageRef.parse(settings.image.base_image, "image.base_image"), "image.base_image")
    elif (own := project_base(settings, target.registry, why)) is not None:
        rep.step(f"build[{variant}]: without the engine, on this project's base {own.docker()}"
                 + (f" (the base or the image's user changed since {previous.ref.docker()})" if previous else ""))
        below = _on_base(settings, target, user_key, store, why, rep, own, "the project's base")
    elif previous is None:
        raise NoEngineBuildError(f"{why}, and the registry has no {target.name}:{human} to build on; build and push "
                                 "once where a Docker engine runs (`raytrain build push`), or put a base in that "
                                 "registry: this project's (`raytrain base.publish`), or one pinned as image.base_image",
                                 f"the registry holds no {target.name}:{human} yet, nor a base of this project")
    else:
        raise NoEngineBuildError(f"{why}, and the base or the image's user changed since {previous.ref.docker()} "
                                 "was built (its user stage is another); build and push once where a Docker "
                                 "engine runs, or put a base in that registry (`raytrain base.publish`)")
    python, compiler = below.python, below.compiler
    wheels = _wheels(settings, variant, python, previous, rep)
    planned, write = _plan(previous, wheels, python, compiler, rep)
    layer_ids, scripts, written = _dependency_layers(planned, write, previous, wheels, python, store,
                                                     f"{repo}:{variant}", user_ref, rep)
    top = venv_layer.top_layer(python, VENV, [sc for _, s in scripts for sc in s])
    app, spec_layer = app_layer(settings), spec_file_layer(loaded)
    for layer in (top, app, spec_layer):
        layers.keep(layer, store)
    labels = image_labels(settings, loaded, variant, wheels.torch_source)
    fields = config_fields(provenance.of_build(user_key, len(below.diff_ids), python, compiler, VENV, wheels.sha256,
                                               wheels.sizes, planned, scripts))
    config = layers.image_config(below.config, [*below.diff_ids, *layer_ids, top.diff_id, app.diff_id,
                                                spec_layer.diff_id],
                                 env={SPEC_ENV: SPEC_PATH_IN_IMAGE}, labels=labels, extra=fields)
    layers.keep_config(config, store)
    sources = source_keys(settings)
    key = spec_key(app_key(deps_key(user_key, planned, python, compiler), sources), loaded.sha256, labels, fields)
    image_id = Digest.of(config)
    at_hand = f", {len(write) - written} at hand here" if len(write) > written else ""
    rep.step(f"build[{variant}]: {repo}:{variant}-{key[:16]} ({image_id.short}); {written} dependency "
             f"layer(s) written{at_hand}, {len(planned) - len(write)} and the base's in the registry")
    same = previous is not None and previous.image_id == image_id  # nothing changed since the previous push
    return BuildRecord(variant=variant, local_ref=f"{repo}:{variant}-{key[:16]}", human_ref=f"{repo}:{human}",
                       image_id=image_id, spec_sha256=loaded.sha256,
                       base_ref=below.base or previous.pinned,
                       torch_source=wheels.torch_source, rebuilt=[] if same else (["user"] if below.base else []) +
                       (["deps"] if write else []) + ["app", "spec"], engine=False, **sources)


def _on_previous(previous: Previous, user_key: str, label_keys: set) -> Below:
    """The previous image's base and user layers, when it was built for this host's Python; else
    NoEngineBuildError."""
    made = previous.made_from
    python = Python(*made.python)
    compiler = bytecode.identity(python.magic, python.cache_tag)
    if made.venv != VENV or compiler is None or compiler != made.compiler:
        raise NoEngineBuildError(
            f"no engine here, and this machine's Python ({sys.version.split()[0]}) does not write the bytecode "
            f"{previous.ref.docker()}'s layers were compiled with "
            f"({(made.compiler or ['in a container'])[0]}); run the build with that Python, or where an engine runs")
    return Below(previous.config["rootfs"]["diff_ids"][:made.lower_layers], _lower_config(previous, label_keys),
                 user_key, python, compiler, None)


def project_base(settings: Settings, registry: str, why: str) -> Optional[ImageRef]:
    """This project's own base (debootstrap) in REGISTRY, where `base.publish` puts it, pinned by the digest the
    registry gives; None where it has none."""
    named = ImageRef.parse(f"{registry}/{base_repository(settings)}:{bootstrap_key(settings)[:16]}", "the project's base")
    reg = RegistryClient(registry, named.repository, settings.registry.stall_timeout_s)
    try:
        found = reg.get_manifest(named.tag)
    except RegistryError as e:
        raise NoEngineBuildError(f"{why}, and this project's base {named.docker()} cannot be read: {str(e)[:300]}",
                                 f"{named.docker()} cannot be read: {str(e)[:160]}") from None
    finally:
        reg.close()
    return None if found is None else named.at(str(Digest.of(found[0])))


def _on_base(settings: Settings, target: ImageRef, user_key: str, store, why: str, rep: Reporter, ref: ImageRef,
             named: str) -> Below:
    """The base REF (image.base_image, or the project's own: NAMED) in the registry TARGET is in, and the user
    layer written here from its /etc; NoEngineBuildError (or registry_base.BaseImageError) saying what does
    not allow it."""
    if ref.registry != target.registry:
        raise NoEngineBuildError(
            f"image.base_image {ref.docker()} is in {ref.registry}, and the image is pushed to {target.registry}: "
            "with no engine the push mounts the base's layers, within one registry; copy the base there (skopeo "
            f"copy docker://{ref.docker()} docker://{target.registry}/{ref.repository}) and name that copy")
    base = registry_base.read_base(ref, settings.image.python, settings.registry.stall_timeout_s, rep, named)
    compiler = bytecode.identity(base.python.magic, base.python.cache_tag)
    if compiler is None:
        raise NoEngineBuildError(
            f"{why}, and {named} {ref.docker()}'s Python {base.python.version} loads bytecode this "
            f"machine's Python ({sys.version.split()[0]}) does not write; run the build with Python "
            f"{base.python.minor}, or where an engine runs")
    try:
        layer = user_stage_layer(settings, base.etc)
    except UserLayerError as e:
        raise NoEngineBuildError(f"{named} {ref.docker()}: {e}") from None
    layers.keep(layer, store)
    config = layers.lower_of(json.loads(user_stage_config(settings, layers.lower_of(base.config), layer)))
    rep.step(f"user: {settings.image.user.name} ({settings.image.user.uid}:{settings.image.user.gid}) written on "
             f"{ref.docker()} (Python {base.python.version} at {base.python.executable})")
    return Below(config["RootFS"]["Layers"], config, user_key, base.python, compiler, ref)


def _wheels(settings: Settings, variant: str, python: Python, previous: Optional[Previous], rep: Reporter) -> _Wheels:
    """The requirement set's wheels: uv resolves it; a wheel the previous image recorded is not downloaded,
    nor read where the pool has it (its sha256 and size are the record's until a layer to write needs its
    bytes: _plan), the others are, and are checked (the lock's hashes, the image's Python)."""
    facts = {w.file: w for w in previous.made_from.wheels} if previous is not None else {}
    labels = ((previous.config.get("config") or {}).get("Labels") or {}) if previous is not None else {}
    torch_req, torch_source = wheelhouse.choose_torch(settings, variant, python.minor, rep,
                                                      known_source=labels.get(TORCH_SOURCE_LABEL))
    index = settings.image.torch[variant].index_url if torch_source not in wheelhouse.DEFAULT_SOURCES else None
    wanted = wheelhouse.image_set(settings, variant, python.minor, torch_req)
    pool = wheelhouse.pool_dir()
    got = wheelhouse.set_files(pool, [r.text for r in wanted], python.minor, variant, index,
                               {_pin_of(f): f for f in facts}, rep)
    files = got.files
    read = {f for f in files if f not in facts}  # all here: hashed and measured, their bytes decide their layers
    sha256, sizes = _read(pool, sorted(read), python.minor, got.checked)
    sha256.update({f: facts[f].sha256 for f in files if f not in read})
    wheelhouse.requirements.check_hashes(wanted, sha256)
    sizes.update({f: (facts[f].size, facts[f].modules) for f in files if f not in read})
    return _Wheels(files, list(got.fetched), sha256, sizes, torch_source, wanted, got.lock, read)


def _read(pool: Path, files: list[str], minor: str, checked: dict[str, str]) -> tuple[dict[str, str], dict]:
    """(sha256, venv_plan.measure) of the pool's wheels FILES from their bytes, each checked as a wheel for the
    image's Python. One just fetched was hashed as it arrived (CHECKED: its lock's sha256), and one the pool
    recorded as checked is as it was then (pool_page.recorded): neither is read again (3.9 GiB for the example)."""
    venv_layer.wheels_of([pool / f for f in files], minor)
    known = {**pool_page.recorded(pool, files), **checked}
    return ({f: known.get(f) or file_sha256(pool / f).hex for f in files},
            {f: venv_plan.measure(pool / f) for f in files})


def _plan(previous: Optional[Previous], wheels: _Wheels, python: Python, compiler: list, rep: Reporter) -> tuple[list, list]:
    """(the dependency layers planned, those to write). A layer whose key the previous image recorded, and
    whose blob the registry holds, is taken; the others are written, so each of their wheels must be here
    and read: one that is not (another wheel of a group layer that changed) is downloaded, and each is
    hashed and measured, and the plan made again with its bytes (a wheel built here from an sdist is not
    the recorded one's bytes). The pool's other wheels are never read (3.9 GiB for the example)."""
    pool = wheelhouse.pool_dir()
    recorded = previous.made_from.by_key() if previous is not None else {}
    held = previous.held if previous is not None else {}
    while True:
        planned, _ = venv_plan.plan([pool / f for f in wheels.files], wheels.sha256, VENV, python.minor, compiler,
                                    wheels.sizes)
        write = [p for p in planned if p.key not in recorded or Digest(recorded[p.key].diff_id) not in held]
        need = sorted({w.name for p in write for w in p.wheels if w.name not in wheels.read})
        if not need:
            return planned, write
        missing = [f for f in need if not (pool / f).is_file()]
        checked: dict[str, str] = {}
        if missing:
            fetched, checked = wheelhouse.fetch_files(pool, missing, python.minor, "registry build", rep, wheels.lock)
            wheels.fetched.extend(fetched)
        lost = [f for f in missing if not (pool / f).is_file()]
        if lost:
            raise NoEngineBuildError(f"{', '.join(lost)}: in the resolution, and the index gave no such file; "
                                     "build where an engine runs")
        sha256, sizes = _read(pool, need, python.minor, checked)
        wheels.sha256.update(sha256)
        wheels.sizes.update(sizes)
        wheels.read.update(need)
        wheelhouse.requirements.check_hashes(wheels.wanted, wheels.sha256)


def _dependency_layers(planned: list, write: list, previous: Optional[Previous], wheels: _Wheels, python: Python, store,
                       ref: str, user_ref: str, rep: Reporter) -> tuple[list, list, int]:
    """(each planned layer's diff ID, its (diff ID, console scripts), how many were written): WRITE's written
    into the store where the layer index has no tar of them, the others the previous image's."""
    pool = wheelhouse.pool_dir()
    recorded = previous.made_from.by_key() if previous is not None else {}
    venv_layer.check_conflicts([w for p in write for w in p.wheels], python, VENV)
    rep.step(f"deps: {len(planned) - len(write)} of {len(planned)} dependency layers taken from the registry, "
             f"{len(write)} to write ({len(wheels.fetched)} wheel(s) downloaded: "
             f"{human_bytes(sum((pool / f).stat().st_size for f in wheels.fetched))})")
    assembly = DepsAssembly(None, store, write, python, VENV, True, None, user_ref, ref, rep,
                            index=LayerIndex(venv_plan.default_index()))
    assembly.write_only()
    written = {p.key: s for p, s in zip(write, assembly.slots)}
    ids, scripts = [], []
    for p in planned:
        if p.key in written:
            ids.append(Digest(written[p.key].diff_id))
            scripts.append((ids[-1], written[p.key].scripts or []))
        else:
            fact = recorded[p.key]
            ids.append(Digest(fact.diff_id))
            scripts.append((ids[-1], [(n, t.encode("utf-8", "surrogateescape")) for n, t in fact.scripts]))
    return ids, scripts, assembly.stats["written"] + assembly.stats["rewritten"]


def _pin_of(wheel_file: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name: what a resolver's pin says of it."""
    name, version, _, _ = parse_wheel_filename(wheel_file)
    return canonicalize_name(name), str(version)

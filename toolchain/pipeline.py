"""What the Invoke tasks do, as plain functions returning summaries (tasks.py stays thin)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

from deploy.job import PreflightError
from deploy.targets.base import Applied, ApplyContext
from runtime.imageref import ImageRef
from runtime.spec import ClusterSpec, json_schema, load_spec, read_spec
from toolchain.image.bootstrap import base_repository, ensure_base
from toolchain.config import Settings
from toolchain.docker_client import engine
from toolchain.errors import ConfigError, RegistryError, ToolchainError
from toolchain.image.images import build_all, layer_store, registry_address
from toolchain.job_inputs import driver_command, given, now, out_dir, pick_run, ranks_fit, resolve_spec
from toolchain.job_inputs import job_env as job_env_of
from runtime import contract as C
from runtime.contract import PROFILE_LABEL
from toolchain.image import registry_build, way
from toolchain.image.registry_base import BaseImageError
from toolchain.records import (PushRecord, write_builds, RunRecord, add_launches, drop_launches, read_builds, read_launches,
                               read_pushes, restore_run, runs_before, write_push, write_run)
from toolchain.progress import Reporter, human_bytes
from toolchain.publish.engine_load import FromBuild
from toolchain.publish.push import BLOB_CACHE, push_image
from deploy.registry.address import is_local, scheme
from toolchain.publish.local_registry import blob_storage, start_local
from deploy import hint


def check_spec(path: Path) -> dict:
    loaded = read_spec(path)
    spec: ClusterSpec = loaded.model
    return {
        "file": str(path),
        "sha256": loaded.sha256,
        "cluster_type": spec.cluster_type,
        "cluster_name": spec.cluster_name,
        "fileroot": spec.fileroot,
        "mounts": [m.as_string() for m in spec.mounts],
        "node_types": spec.node_type_from_node_name,
        "gpu_types": spec.gpu_type_from_node_name,
        "cpu_image": spec.cpu_image,
        "gpu_image": spec.gpu_image,
        "registry": spec.registry,
        "slurm": spec.slurm.model_dump() if spec.slurm else None,
        "kubernetes": spec.kubernetes.model_dump() if spec.kubernetes else None,
    }


def write_schema(out: Path) -> Path:
    out.write_text(json.dumps(json_schema(), indent=2) + "\n")
    return out


def pick_variants(settings: Settings, variant: str | None) -> list[str]:
    if given(variant, "--variant") is None:
        return list(settings.image.variants)
    chosen = [v.strip() for v in variant.split(",")]
    for v in chosen:
        if v not in settings.image.variants:
            raise ConfigError(f"--variant: {v!r} is not one of the configured variants ({', '.join(settings.image.variants)})")
    return chosen


def bootstrap_base(settings: Settings, rep: Reporter) -> dict:
    base = ensure_base(engine(), settings, rep)
    return {"base": base.ref, "image_id": base.image_id, "built": base.built}


def push_base(settings: Settings, to: str | None, rep: Reporter) -> dict:
    """The base (bootstrapped here, or image.base_image from the local engine) pushed to TO
    (registry/repository; default: registry.address/<image.repository>-base): what a runner with no engine
    builds on, pinned in image.base_image."""
    client = engine()
    base = ensure_base(client, settings, rep)
    where = given(to, "--to") or f"{settings.registry.address}/{base_repository(settings)}"
    target = ImageRef.parse(where, "--to")
    if target.registry is None or target.tag or target.digest:
        raise ConfigError(f"--to: {where[:120]!r} is not registry/repository (e.g. registry.example.com/team/base); "
                          "the tag is the base's key")
    if is_local(target.registry):
        start_local(settings.model_copy(update={"registry": settings.registry.model_copy(
            update={"address": target.registry})}), rep)
    tag = base.key[:16]
    res = push_image(client, "base", base.image_id, target, [tag], settings.registry.retries,
                     settings.registry.retry_backoff_s, rep, settings.registry.stall_timeout_s)
    found = (f"a build with no engine for {target.registry} finds it there" if given(to, "--to") is None
             and not settings.image.base_image else
             f"a build with no engine builds on it with image.base_image = \"{res.repo_digest}\"")
    rep.step(f"pushed the base: {res.repo_digest} ({res.layers_pushed} layer(s) uploaded, "
             f"{human_bytes(res.bytes_uploaded)}); {found}")
    return {"base": base.ref, "image_id": base.image_id, "base_image": str(res.repo_digest)}


def build(settings: Settings, spec: str | None, variant: str | None, rep: Reporter, profile: str | None = None,
          load: bool = False) -> dict:
    """Each variant's image, in the engine or from what the registry holds (toolchain/image/way.py decides;
    LOAD: in the engine)."""
    if given(profile, "--profile") is not None:
        if profile not in C.PROFILES:
            raise ConfigError(f"--profile: {profile[:40]!r} is not a profile; use one of {', '.join(C.PROFILES)}")
        settings = settings.model_copy(update={"image": settings.image.model_copy(update={"profile": profile})})
    spec_file = resolve_spec(settings, spec)
    variants = pick_variants(settings, variant)
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    loaded = read_spec(spec_file)
    ways = way.choose(settings, load, variants)
    # the images made for the registry only come last: they take the dependency layers the engine's build of
    # the others wrote beside its loads (one image's layers are most of another's)
    built = _build_each(settings, [v for v in variants if not ways[v].base_to_local], ways, loaded, rep)
    built += _build_each(settings, [v for v in variants if ways[v].base_to_local], ways, loaded, rep)
    for b in built:
        rep.step(f"built {b.variant}: {b.local_ref} (also {b.human_ref}); rebuilt: {', '.join(b.rebuilt) or 'nothing'}")
    return {"spec": str(spec_file), "images": {b.variant: b.model_dump() for b in built}}


def _build_each(settings: Settings, variants: list[str], ways: dict, loaded, rep: Reporter) -> list:
    """VARIANTS built as WAYS say: from the registry first where they say so, the others (and those the registry
    cannot give, with one line saying why) in the engine."""
    built, in_engine = [], []
    for v in variants:
        chosen = ways[v]
        if not chosen.registry_first:
            in_engine.append(v)
            continue
        try:
            if chosen.base_to_local:
                _base_to_local(settings, registry_address(settings, loaded.model, v), rep)
            built.append(registry_build.build_variant(settings, v, loaded, chosen.why, rep))
        except (registry_build.NoEngineBuildError, BaseImageError) as e:
            if chosen.client is None:
                raise
            cause = e.cause if isinstance(e, registry_build.NoEngineBuildError) else str(e)
            rep.step(f"build[{v}]: in the engine ({cause[:300]})")
            in_engine.append(v)
    if built:
        write_builds(settings.build_dir, built)
    if in_engine:
        built += build_all(ways[in_engine[0]].client, settings, in_engine, loaded, rep)
    return built


def _base_to_local(settings: Settings, address: str, rep: Reporter) -> None:
    """The project's own base (debootstrap) put in ADDRESS, where that is this tool's local registry and lacks
    it, so that an image the engine here does not run is built without it (way.py). Elsewhere nothing is
    written: the registry build says what is missing."""
    if settings.image.base_image or not is_local(address):
        return
    local = settings.model_copy(update={"registry": settings.registry.model_copy(update={"address": address})})
    try:
        start_local(local, rep)
    except RegistryError:
        return  # the registry build's cause says the registry is not running
    if registry_build.project_base(settings, address, f"the local registry {address}") is None:
        push_base(local, None, rep)


def push(settings: Settings, spec: str | None, variant: str | None, rep: Reporter) -> dict:
    spec_file = resolve_spec(settings, spec)
    built = read_builds(settings.build_dir)
    loaded = read_spec(spec_file)
    sha = loaded.sha256
    variants = pick_variants(settings, variant) if variant is not None else _built_for(settings, built, sha, spec_file, rep)
    missing = [v for v in variants if v not in built]
    if missing:
        have = [v for v in settings.image.variants if v in built]
        instead = f", or push what was built: {hint.cmd('push --variant ' + ','.join(have))}" if have else ""
        raise ConfigError(f"no build recorded for {', '.join(missing)} in {settings.build_dir / 'build.json'}; "
                          f"build it: {hint.cmd('build --variant ' + ','.join(missing))}{instead}")
    with_engine = [v for v in variants if built[v].engine]
    try:
        client = engine() if with_engine else None
    except ToolchainError as e:  # a runner with no engine, and a build.json an engine's build also wrote
        others = [v for v in variants if v not in with_engine]
        instead = f"push the others: {hint.cmd('push --variant ' + ','.join(others))}, or " if others else ""
        raise ToolchainError(f"{e}; the {', '.join(with_engine)} build in build.json was made with the engine, "
                             f"whose image the push reads: {instead}build it here again: "
                             f"{hint.cmd('build --variant ' + ','.join(with_engine))}") from None
    store = layer_store(settings.build_dir)
    results = {}
    pushed_to = {(r.registry, r.ref.repository) for r in read_pushes(settings.build_dir).values()}  # blobs to mount from
    for v in variants:
        address = registry_address(settings, loaded.model, v)
        if is_local(address):
            start_local(settings.model_copy(update={"registry": settings.registry.model_copy(update={"address": address})}), rep)
        entry = built[v]
        if entry.spec_sha256 != sha:
            raise ConfigError(f"the {v} build was made from another spec (sha256 {entry.spec_sha256[:12]}, now {sha[:12]}); "
                              f"build with this spec: INVOKE_PROJECT_SPEC={_shown(settings, spec_file)} {hint.cmd('build push')}")
        image_id, config = _image_of(client, entry, store)
        repo, content_tag, human_tag = entry.local_ref.repository, entry.local_ref.tag, entry.human_ref.tag
        target = ImageRef.parse(f"{address}/{repo}", "push target")  # a registry address may carry a path
        # the layers not in the layer store come from `docker save` of the smallest stage that has them
        below = [ref.docker() for ref in entry.stages()]
        # built with no engine on a base in the registry: its layers are mounted from the base's repository
        held_from = [entry.base_ref] if not entry.engine and entry.base_ref.repository != target.repository else []
        res = push_image(client if entry.engine else None, v, image_id, target, [content_tag, human_tag],
                         settings.registry.retries, settings.registry.retry_backoff_s, rep,
                         settings.registry.stall_timeout_s, layer_store=store,
                         blob_cache=settings.build_dir / BLOB_CACHE, candidates=below,
                         mount_from=sorted(r for a, r in pushed_to if a == address and r != repo),
                         share_with=blob_storage(settings) if is_local(address) and address == settings.registry.address
                         else None, held_from=held_from)
        pushed_to.add((address, repo))
        record = PushRecord(
            local_ref=entry.local_ref, image_id=image_id, repo_digest=res.repo_digest, digest=res.digest,
            spec_sha256=sha, spec_file=_shown(settings, spec_file), registry=address, registry_scheme=scheme(address),
            tags=[content_tag, human_tag], user=config.get("User") or "",
            profile=(config.get("Labels") or {}).get(PROFILE_LABEL) or "default")
        path = write_push(settings.build_dir, v, record)
        mounted = f", {res.layers_mounted} mounted from another repository" if res.layers_mounted else ""
        mounted += (f", {res.layers_known_from_registry} of them known from the previous image"
                    if res.layers_known_from_registry else "")
        compressed = (f"; {human_bytes(res.bytes_compressed)} of layers compressed"
                      if res.bytes_compressed else "")
        compressed += (f"; {human_bytes(res.bytes_shared)} of blobs stored once with the registry's files"
                       if res.bytes_shared else "")
        rep.step(f"pushed {v}: {res.repo_digest} ({res.layers_pushed} layers uploaded, "
                 f"{res.layers_existing + res.layers_known_from_registry} already there{mounted}, {human_bytes(res.bytes_uploaded)}, "
                 f"{res.seconds:.1f}s{compressed})")
        results[v] = {**record.model_dump(), "push": res.as_dict()}
    return {"images_json": str(path), "images": results}


def _image_of(client, entry, store) -> tuple[str, dict]:
    """(image ID, its config's `config` part) of a build: from the engine, or, for one built with no engine,
    from the config the layer store keeps."""
    if entry.engine:
        try:
            image = client.images.get(entry.local_ref.docker())
        except Exception:
            raise ToolchainError(f"image {entry.local_ref} from build.json is not in the engine; run `{hint.cmd('build')}` "
                                 "again") from None
        return image.id, image.attrs.get("Config") or {}
    data = store.read_config(entry.image_id)
    if data is None:
        raise ToolchainError(f"the config of {entry.local_ref} is not in the layer store ({store}) as it was built; "
                             f"run `{hint.cmd('build')}` again")
    return entry.image_id, json.loads(data).get("config") or {}


def _built_for(settings: Settings, built: dict, sha: str, spec_file: Path, rep: Reporter) -> list[str]:
    """Without --variant, push pushes what build recorded for this spec (`invoke build --variant cpu push`)."""
    chosen = [v for v in settings.image.variants if v in built and built[v].spec_sha256 == sha]
    if not chosen:
        raise ConfigError(f"no build recorded for spec {_shown(settings, spec_file)} in {settings.build_dir / 'build.json'}; "
                          f"run `{hint.cmd('build')}` first (with INVOKE_PROJECT_SPEC={_shown(settings, spec_file)} if it is not "
                          "the default)")
    stale = [v for v in settings.image.variants if v in built and v not in chosen]
    if stale:
        rep.step(f"not pushing {', '.join(stale)}: built from another spec (build it again to push it)")
    return chosen


class DeployResult(BaseModel):
    """What `deploy` made of the job: the job as rendered, where its files go, and (unless a dry run)
    what the target did; `--json` prints it."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str
    job: dict                        # the validated job (deploy/job.py JobSpec), as JSON
    out_dir: str
    files: list[str]
    notes: list[str]
    sqsh: Optional[str] = None       # Pyxis --sqsh: what srun is told
    rendered: Optional[dict[str, str]] = None  # a dry run: each file's text, nothing written
    objects: Optional[list] = None   # a dry run of a target that writes no files (local): what it would start
    applied: Optional[Applied] = None  # what the target's apply did (None in a dry run)


def _warn_if_code_changed(settings: Settings, gpus_per_node: int, rep: Reporter) -> None:
    """A job runs the code in its image: say so when the project's code is not what the image was built
    from (an edited script, a new one --torchrun names), before a scheduler finds out."""
    from deploy.job import job_variant
    from toolchain.hashing import tree_hash
    variant = job_variant(gpus_per_node)
    built = read_builds(settings.build_dir).get(variant)
    app_dir = settings.path(settings.project.app_dir)
    if built is not None and built.code_sha256 and built.code_sha256 != tree_hash(app_dir):
        rep.warn(f"the code in {app_dir} changed since the {variant} image was built; the job runs the image's "
                 f"code. To run this code: {hint.cmd(f'build --variant {variant} push')}, then deploy")


def deploy(settings: Settings, spec: str | None, target: str | None, *, rep: Reporter, dry_run: bool = False,
           name: str | None = None, nodes: int | None = None, gpus: int | None = None, out: str | None = None,
           env: dict | None = None, resume: bool = False, command: str | None = None, serve: bool = False,
           torchrun: str | None = None, nproc_per_node: int | None = None, max_restarts: int | None = None,
           job_env: list[str] | None = None, **flags) -> DeployResult:
    """Pre-flight (spec, pushed digest, job values, the target's own checks), render, then apply.
    Each deploy is a new run (RAYTRAIN_RUN_ID, recorded in build/runs.json); `resume` continues the last
    run of this job name instead.

    `flags` are the target's options as given (only those set); one the target does not take is an
    error. --dry-run returns the rendered files and writes, converts and starts nothing. `env`: the
    environment of the tools the target runs (sbatch, kubectl); `job_env`: --env KEY=VALUE as given.
    """
    from deploy.job import ImageInfo
    from deploy.plan import make_request, plan

    spec_file = resolve_spec(settings, spec)
    loaded = read_spec(spec_file)
    cluster = loaded.model
    d = settings.deploy
    target_name = given(target, "--target") or d.target
    pushes = read_pushes(settings.build_dir)
    images = {v: ImageInfo(ref=r.ref, spec_sha256=r.spec_sha256, spec_file=r.spec_file, user=r.user,
                           registry_scheme=r.registry_scheme, profile=r.profile)
              for v, r in pushes.items()}
    job_name = d.name if given(name, "--name") is None else name
    run_id = pick_run(settings, job_name, resume)
    driver = driver_command(settings, command, torchrun, nproc_per_node, max_restarts)
    job_values = dict(name=job_name, nodes=d.nodes if nodes is None else nodes,
                      command=driver, cpus_per_node=d.cpus_per_node,
                      memory=d.memory, port_base=d.port_base,
                      time_limit=d.time_limit, env={**job_env_of(settings, job_env), C.RUN_ID: run_id}, serve=serve)
    req = make_request(target_name, flags, cluster, _shown(settings, spec_file), loaded.sha256, images,
                       job_values, gpus, settings.path(settings.project.app_dir), settings.build_dir)
    ranks_fit(nproc_per_node, req.job.gpus_per_node)
    chosen_out = out_dir(settings, out)
    if not serve:  # a held cluster's code comes with each `run`
        _warn_if_code_changed(settings, req.job.gpus_per_node, rep)
    try:
        artifacts = plan(req, dry_run)
    except PreflightError as e:
        if dry_run and e.artifacts is not None:  # shown, then the problems and exit 2
            rep.step("dry run: the artifacts as they would be; pre-flight found the problems below")
            show_dry_run(e.artifacts.texts(), None if e.artifacts.files else e.artifacts.objects)
        raise
    job = req.job
    if not serve:
        rep.step(f"run {run_id}" + (" (resumed: its checkpoints are continued)" if resume else
                                    " (a new run; `--resume` continues the last one of this --name)"))
    out_to = chosen_out or settings.build_dir / "deploy" / req.target.name / job.name
    result = DeployResult(target=req.target.name, job=job.model_dump(mode="json"), out_dir=str(out_to),
                          files=sorted(artifacts.files), notes=list(artifacts.notes),
                          sqsh=artifacts.extra.get("sqsh_ref"))
    for note in artifacts.notes:
        rep.step(f"note: {note}")
    if dry_run:
        return result.model_copy(update={"rendered": artifacts.texts(),
                                         "objects": None if artifacts.files else artifacts.objects})
    before = runs_before(settings.build_dir)
    if not serve:  # a held cluster runs nothing itself; each `invoke run` is a run (toolchain/held.py)
        write_run(settings.build_dir, job.name, RunRecord(run_id=run_id, target=req.target.name,
                                                          image=str(job.image or ""), started=now()))
    ctx = ApplyContext(out_dir=out_to, engine=engine, progress=rep.step, env=env,
                       layer_store=layer_store(settings.build_dir), from_build=FromBuild.of(settings.build_dir, pushes),
                       launching=lambda names: add_launches(settings.build_dir, req.target.name, job.name, names))
    try:
        applied = req.target.apply(artifacts, job, cluster, req.options, ctx)
    except Exception:  # nothing ran (no engine for the .sqsh, sbatch refused): --resume keeps the last run
        if not serve:
            restore_run(settings.build_dir, job.name, before)
        raise
    if applied.exit_code not in (None, 0):
        diagnosis = f"\n  {applied.diagnosis}" if applied.diagnosis else ""
        raise ToolchainError(f"the job {job.name!r} failed: the head exited with {applied.exit_code}{diagnosis}")
    return result.model_copy(update={"applied": applied})


def destroy(settings: Settings, spec: str | None, target: str | None, name: str | None, rep: Reporter) -> dict:
    """Delete what `deploy --submit` left running on TARGET for the job NAME (the target's own destroy)."""
    from deploy.targets import get as get_target

    chosen = get_target(given(target, "--target") or settings.deploy.target)
    group = settings.deploy.name if given(name, "--name") is None else name
    launched = read_launches(settings.build_dir, chosen.name, group)
    if launched:
        rep.step(f"destroy: removing what `deploy --target {chosen.name} --name {group}` launched: {', '.join(launched)}")
    out = chosen.destroy(load_spec(resolve_spec(settings, spec)), group, launched)  # a failure keeps the record
    drop_launches(settings.build_dir, chosen.name, group, out.removed)
    rep.step(out.said)
    return {"group": out.group, "said": out.said, "removed": out.removed, **out.details}


def _shown(settings: Settings, path: Path) -> str:
    """A path as the user would type it: relative to the project when it is inside it."""
    try:
        return str(path.resolve().relative_to(settings.root.resolve()))
    except ValueError:
        return str(path)


def show_dry_run(rendered: dict, objects) -> None:
    """A dry run's artifacts on stdout, each file under a header (objects as JSON where there are no files)."""
    for fname, text in (rendered or {}).items():
        print(f"# ---- {fname} (dry run: not written)\n{text}")
    if objects:
        print(json.dumps(objects, indent=2, default=str))

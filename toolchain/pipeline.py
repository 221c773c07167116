"""What the Invoke tasks do, as plain functions returning summaries (tasks.py stays thin)."""
from __future__ import annotations

import json
from pathlib import Path

from runtime.spec import ClusterSpec, json_schema, load_spec, spec_hash
from toolchain.bootstrap import ensure_base
from toolchain.config import Settings
from toolchain.docker_client import engine
from toolchain.errors import ConfigError, ToolchainError
from toolchain.images import build_all
from toolchain.metadata import read_build, record_image
from toolchain.progress import Reporter, human_bytes
from toolchain.push import push_image
from toolchain.registry import is_local, scheme, start_local


def resolve_spec(settings: Settings, spec: str | None) -> Path:
    path = settings.path(spec or settings.project.spec)
    load_spec(path)  # raises SpecError with every problem listed
    return path


def check_spec(path: Path) -> dict:
    spec: ClusterSpec = load_spec(path)
    return {
        "file": str(path),
        "sha256": spec_hash(path),
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
    if not variant:
        return list(settings.image.variants)
    chosen = [v.strip() for v in variant.split(",") if v.strip()]
    for v in chosen:
        if v not in settings.image.variants:
            raise ConfigError(f"--variant: {v!r} is not one of the configured variants ({', '.join(settings.image.variants)})")
    return chosen


def bootstrap_base(settings: Settings, rep: Reporter) -> dict:
    base = ensure_base(engine(), settings, rep)
    return {"base": base.ref, "image_id": base.image_id, "built": base.built}


def build(settings: Settings, spec: str | None, variant: str | None, rep: Reporter) -> dict:
    spec_file = resolve_spec(settings, spec)
    variants = pick_variants(settings, variant)
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    built = build_all(engine(), settings, variants, spec_file, rep)
    for b in built:
        rep.step(f"built {b.variant}: {b.local_ref} (also {b.human_ref}); rebuilt: {', '.join(b.rebuilt) or 'nothing'}")
    return {"spec": str(spec_file), "images": {b.variant: b.as_dict() for b in built}}


def registry_address(settings: Settings, spec_file: Path) -> str:
    return load_spec(spec_file).registry or settings.registry.address


def push(settings: Settings, spec: str | None, variant: str | None, rep: Reporter) -> dict:
    spec_file = resolve_spec(settings, spec)
    variants = pick_variants(settings, variant)
    built = read_build(settings.build_dir)
    missing = [v for v in variants if v not in built]
    if missing:
        raise ConfigError(f"no build recorded for {', '.join(missing)} in {settings.build_dir / 'build.json'}; run `invoke build` first")
    address = registry_address(settings, spec_file)
    if is_local(address):
        start_local(settings.model_copy(update={"registry": settings.registry.model_copy(update={"address": address})}), rep)
    client = engine()
    sha = spec_hash(spec_file)
    results = {}
    for v in variants:
        entry = built[v]
        if entry["spec_sha256"] != sha:
            raise ConfigError(f"the {v} build was made from another spec (sha256 {entry['spec_sha256'][:12]}, now {sha[:12]}); run `invoke build` again")
        try:
            image = client.images.get(entry["local_ref"])
        except Exception:
            raise ToolchainError(f"image {entry['local_ref']} from build.json is not in the engine; run `invoke build` again") from None
        repo, content_tag = entry["local_ref"].rsplit(":", 1)
        _, human_tag = entry["human_ref"].rsplit(":", 1)
        target = f"{address}/{repo}"
        res = push_image(client, v, image.id, target, [content_tag, human_tag],
                         settings.registry.retries, settings.registry.retry_backoff_s, rep)
        record = {
            "local_ref": entry["local_ref"], "image_id": image.id, "repo_digest": res.repo_digest,
            "digest": res.digest, "spec_sha256": sha, "spec_file": _shown(settings, spec_file),
            "registry": address, "registry_scheme": scheme(address), "tags": [content_tag, human_tag],
            "user": (image.attrs.get("Config") or {}).get("User") or "",
        }
        path = record_image(settings.build_dir, v, record)
        rep.step(f"pushed {v}: {res.repo_digest} ({res.layers_pushed} layers uploaded, "
                 f"{res.layers_existing} already there, {human_bytes(res.bytes_uploaded)}, {res.seconds:.1f}s)")
        results[v] = {**record, "push": res.as_dict()}
    return {"images_json": str(path), "images": results}


def deploy(settings: Settings, spec: str | None, target: str | None, nodes: int | None, name: str | None,
           dry_run: bool, rep: Reporter, *, out: str | None = None, submit: bool = False, gpus: int | None = None,
           seeds: str | None = None, slots: str | None = None, sqsh: bool = False, sqsh_to_fileroot: bool = False,
           port_stride: int = 0, partition: str | None = None, account: str | None = None,
           allow_local_registry: bool = False, allow_http_registry: bool = False) -> dict:
    """Pre-flight (spec, pushed digests, job values, target sections), render, then write/submit/run.

    --dry-run returns the rendered files in the summary and writes, converts and starts nothing.
    """
    from deploy import k8s, targets
    from deploy.job import IMAGE_WORKDIR, DeployError, build_job, job_variant
    from toolchain.metadata import images_file, read_images

    spec_file = resolve_spec(settings, spec)
    cluster = load_spec(spec_file)
    target = target or settings.deploy.target
    d = settings.deploy
    job_name = name or d.name
    try:
        if target not in targets.TARGETS:
            raise DeployError(f"--target: {target!r} is not one of {', '.join(targets.TARGETS)}")
        plain = target == "slurm"
        images = read_images(settings.build_dir)
        job = build_job(cluster, images, images_file(settings.build_dir),
                        name=job_name, nodes=nodes or d.nodes, command=list(d.command), cpus_per_node=d.cpus_per_node,
                        port_base=d.port_base, time_limit=d.time_limit,
                        gpus_per_node=gpus if gpus is not None else _spec_gpus(cluster, target),
                        workdir=str(settings.path(settings.project.app_dir)) if plain else
                        (IMAGE_WORKDIR if target in ("pyxis", "k8s") else None),
                        needs_image=not plain)
        req = targets.Request(
            target=target, spec=cluster, job=job,
            out_dir=settings.path(out) if out else settings.build_dir / "deploy" / target / job_name,
            submit=submit, seeds=_int_list(seeds, "--seeds"), slots=[k8s.Slot.parse(x) for x in _words(slots)],
            sqsh_dir=settings.build_dir / "sqsh" if sqsh else None, sqsh_to_fileroot=sqsh_to_fileroot,
            port_stride=port_stride, image_record=images.get(job_variant(job.gpus_per_node), {}) if job.image else {},
            spec_file=_shown(settings, spec_file), spec_sha256=spec_hash(spec_file), partition=partition,
            account=account, allow_local_registry=allow_local_registry, allow_http_registry=allow_http_registry)
        plan = targets.plan(req)
    except DeployError as e:
        raise ConfigError(str(e)) from None
    summary = plan.summary()
    for note in plan.notes:
        rep.step(f"note: {note}")
    if target == "local":
        from deploy import local
        summary["containers"] = [{**n.__dict__, "environment": {**n.environment, "RAY_AUTH_TOKEN": "<generated per run>"}}
                                 for n in local.plan(job, "<run-id>")]
    if dry_run:
        summary["rendered"] = plan.files
        return summary
    try:
        result = targets.execute(plan, engine, rep.step)
    except DeployError as e:
        raise ToolchainError(str(e)) from None
    summary.update(result)
    if target == "local" and summary["exit_code"] != 0:
        raise ToolchainError(f"the job {job.name!r} failed: the head exited with {summary['exit_code']}")
    return summary


def destroy(settings: Settings, spec: str | None, name: str | None, rep: Reporter) -> dict:
    """Delete the Kubernetes objects a k8s deploy --submit created (by label), seeds included."""
    from deploy import k8s
    from deploy.job import DeployError

    cluster = load_spec(resolve_spec(settings, spec))
    if cluster.kubernetes is None:
        raise ConfigError("the cluster spec has no 'kubernetes' section: nothing to destroy")
    group = name or settings.deploy.name
    try:
        out = k8s.destroy(group, cluster.kubernetes.namespace)
    except DeployError as e:
        raise ToolchainError(str(e)) from None
    rep.step(f"deleted objects labelled {k8s.LABEL_GROUP}={group} in {cluster.kubernetes.namespace}")
    return {"group": group, "namespace": cluster.kubernetes.namespace, "kubectl": out}


def _shown(settings: Settings, path: Path) -> str:
    """A path as the user would type it: relative to the project when it is inside it."""
    try:
        return str(path.resolve().relative_to(settings.root.resolve()))
    except ValueError:
        return str(path)


def _spec_gpus(cluster: ClusterSpec, target: str) -> int:
    """GPUs per node when --gpus is not given: what the spec's section for the target says."""
    if target in ("slurm", "pyxis") and cluster.slurm:
        return cluster.slurm.gpus_per_node
    if target == "k8s" and cluster.kubernetes:
        return cluster.kubernetes.gpus_per_pod
    return 0


def _words(text: str | None) -> list[str]:
    return [w for w in (text or "").replace(",", " ").split() if w]


def _int_list(text: str | None, flag: str) -> list[int]:
    out = []
    for w in _words(text):
        if "-" in w:
            lo, _, hi = w.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ConfigError(f"{flag}: {w!r} is not a range like 1-8")
            out += range(int(lo), int(hi) + 1)
        elif w.isdigit():
            out.append(int(w))
        else:
            raise ConfigError(f"{flag}: {w!r} is not a whole number")
    return out

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
from toolchain.registry import is_local, start_local


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
            "digest": res.digest, "spec_sha256": sha, "registry": address, "tags": [content_tag, human_tag],
        }
        path = record_image(settings.build_dir, v, record)
        rep.step(f"pushed {v}: {res.repo_digest} ({res.layers_pushed} layers uploaded, "
                 f"{res.layers_existing} already there, {human_bytes(res.bytes_uploaded)}, {res.seconds:.1f}s)")
        results[v] = {**record, "push": res.as_dict()}
    return {"images_json": str(path), "images": results}


def deploy(settings: Settings, spec: str | None, target: str | None, nodes: int | None, name: str | None,
           dry_run: bool, rep: Reporter) -> dict:
    """Pre-flight (spec, pushed digests, job values) before anything starts; then the target."""
    from deploy import local
    from deploy.job import DeployError, build_job
    from toolchain.metadata import images_file, read_images

    spec_file = resolve_spec(settings, spec)
    target = target or settings.deploy.target
    if target != "local":
        raise ConfigError(f"--target: {target!r} is not available yet; use 'local' (sbatch, pyxis and k8s are in progress)")
    d = settings.deploy
    try:
        job = build_job(load_spec(spec_file), read_images(settings.build_dir), images_file(settings.build_dir),
                        name=name or d.name, nodes=nodes or d.nodes, command=list(d.command),
                        cpus_per_node=d.cpus_per_node, port_base=d.port_base, time_limit=d.time_limit, gpus_per_node=0)
    except DeployError as e:
        raise ConfigError(str(e)) from None
    nodes_plan = local.plan(job, "<run-id>")
    summary = {"target": target, "job": job.model_dump(mode="json"),
               "containers": [{**n.__dict__, "environment": {**n.environment, "RAY_AUTH_TOKEN": "<generated per run>"}}
                              for n in nodes_plan]}
    if dry_run:
        return summary
    client = engine()
    try:
        client.images.get(job.image)
    except Exception:
        rep.step(f"deploy: pulling {job.image}")
        client.images.pull(job.image)
    rep.step(f"deploy[local]: {job.nodes} node(s) of {job.image}")
    code = local.run(client, job)
    summary["exit_code"] = code
    if code != 0:
        raise ToolchainError(f"the job {job.name!r} failed: the head exited with {code}")
    return summary

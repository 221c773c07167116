"""`--target skypilot`: a SkyPilot task YAML (the seed's multi-node system), one per seed with --seeds.

    num_nodes                the job's nodes
    resources.image_id       docker:<registry/repo@sha256:...> (the pushed digest)
    resources.accelerators   <GPU type>:<GPUs per node> when the job has GPUs (--accelerator, else the
                             spec's one GPU type)
    envs                     the job's variables; secrets: RAY_AUTH_TOKEN (null: `sky launch --secret`
                             passes a fresh one, never in the file)
    file_mounts              the fileroot from --fileroot-store (a bucket URI, MOUNT mode)
    run                      `python -m runtime launch` on every node; SkyPilot's own variables
                             (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, ...) place each node; rank 0 runs the driver
`--submit` runs `sky launch -y -d --down -c <name> --secret RAY_AUTH_TOKEN <file>` per task: SkyPilot
tears the cluster down once its job ends (`--down`), and `destroy` runs `sky down` for the clusters
recorded as launched under the name (build/launched.json). A launch that fails says the `sky down` that
removes what it left. `invoke up` launches the one task with every node serving and holds the cluster
(deploy/targets/skypilot/held.py), which `down` removes.

The image must be built with the SkyPilot profile (`build --profile skypilot`: toolchain/image/images.py):
SkyPilot's pod setup needs a user that can become root and a few tools; pre-flight refuses another.
"""
from __future__ import annotations

import os
import re
from typing import Optional

from pydantic import Field, field_validator

from deploy import hint
from deploy.handles import SkyHandle
from deploy.job import DeployError, JobSpec
from deploy.targets.skypilot import held
from deploy.targets.skypilot.task import IMAGE_ENV, by_rank, dump
from deploy.targets.base import AllowLocalRegistry, Applied, ApplyContext, Artifacts, Destroyed, File, Target, TargetOptions
from deploy.targets.seeds import Seeds, seeds_problems
from runtime import contract as C
from runtime.contract import SKYPILOT_PROFILE as PROFILE
from runtime.spec import ClusterSpec


class SkyFlags(TargetOptions):
    """skypilot's options; each description is its flag's help."""
    seeds: Seeds
    accelerator: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description=(
        "accelerator name for resources.accelerators (default: the spec's one GPU type)."))
    fileroot_store: Optional[str] = Field(None, pattern=r"^(s3|gs|r2|cos|oci|https)://[A-Za-z0-9_-][A-Za-z0-9_./-]{0,499}$",
                                          description="bucket URI mounted at the fileroot (e.g. s3://bucket/runs).")

    @field_validator("fileroot_store")
    @classmethod
    def _one_place(cls, v: Optional[str]) -> Optional[str]:
        """A bucket and a path in it, each part named: '.', '..' or an empty part would name another place."""
        if v is not None and any(part in ("", ".", "..") for part in v.split("://", 1)[1].rstrip("/").split("/")):
            raise ValueError("an empty, '.' or '..' part names another place; give the bucket and its path, e.g. "
                             "s3://bucket/runs")
        return v
    allow_local_registry: AllowLocalRegistry


def run_script(job: JobSpec) -> str:
    """The `run:` section: the rank decides who runs the driver (or, held, who serves)."""
    return by_rank(job.launch_argv(driver=True), job.launch_argv(), cd=job.workdir)


def accelerator_name(spec: ClusterSpec, opts: SkyFlags) -> Optional[str]:
    if opts.accelerator:
        return opts.accelerator
    types = sorted(set(spec.gpu_type_from_node_name.values()))
    return types[0] if len(types) == 1 and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", types[0]) else None


GB_PER_CPU = 4  # memory per node when the job sets none (SkyPilot's own default on Kubernetes is 1 GB a pod)


def memory_gb(job: JobSpec) -> int:
    """The job's memory per node in whole GB, rounded up (SkyPilot counts GB); GB_PER_CPU per CPU if unset."""
    if not job.memory:
        return GB_PER_CPU * job.cpus_per_node
    unit = job.memory[-1] if job.memory[-1] in "KMGT" else ""
    n = int(job.memory.rstrip("KMGT"))
    return max(1, -(-n * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit] // 2**30))


def task(job: JobSpec, spec: ClusterSpec, opts: SkyFlags, seed: Optional[int] = None) -> dict:
    resources: dict = {"image_id": f"docker:{job.image.docker()}", "cpus": f"{job.cpus_per_node}+",
                       "memory": f"{memory_gb(job)}+"}
    if job.gpus_per_node:
        resources["accelerators"] = f"{accelerator_name(spec, opts)}:{job.gpus_per_node}"
    envs = {**IMAGE_ENV, **job.env, C.JOB_NAME: job.name}
    if seed is not None:
        envs[C.SEED] = str(seed)
    out = {"name": job.name, "num_nodes": job.nodes, "resources": resources, "envs": envs,
           "secrets": {C.AUTH_TOKEN: None}}
    if opts.fileroot_store:
        out["file_mounts"] = {job.fileroot: {"source": opts.fileroot_store, "mode": "MOUNT"}}
    out["run"] = run_script(job)
    return out


class SkyPilot(Target):
    name = "skypilot"
    summary = "SkyPilot task YAML: num_nodes, the image by digest, `python -m runtime launch` on every node"
    Options = SkyFlags
    pulls_image = True

    def allows_local_registry(self, opts: SkyFlags) -> bool:
        return opts.allow_local_registry

    def preflight(self, job: JobSpec, spec: ClusterSpec, opts: SkyFlags) -> list[str]:
        problems = []
        if job.gpus_per_node and not accelerator_name(spec, opts):
            problems.append("--accelerator: the job has GPUs and the spec's gpu_type_from_node_name does not name "
                            "exactly one GPU type SkyPilot can take; pass --accelerator (e.g. A100)")
        problems += seeds_problems(job, opts.seeds)
        info = job.image_info
        if info is not None and info.profile != PROFILE:
            problems.append(f"the pushed image {job.image.docker() if job.image else ''} has no SkyPilot profile: "
                            "SkyPilot's pod setup needs a user that can become root (sudo) and curl, rsync, sshd; "
                            f"build it with `{hint.cmd('build --profile skypilot push')}` (the other targets' images "
                            "stay without it)")
        return problems

    def render(self, job: JobSpec, spec: ClusterSpec, opts: SkyFlags) -> Artifacts:
        runs = ([(job.model_copy(update={"name": f"{job.name}-s{s}", "command": [*job.command, "--seed", str(s)]}), s)
                 for s in opts.seeds] if opts.seeds else [(job, None)])
        tasks = [task(j, spec, opts, seed) for j, seed in runs]
        notes = [] if opts.fileroot_store else [
            f"fileroot {job.fileroot} is not mounted (no --fileroot-store): checkpoints stay on each node"]
        if not job.memory:
            notes.append(f"memory per node: {memory_gb(job)} GB ({GB_PER_CPU} GB per CPU; deploy.memory sets it)")
        return Artifacts({f"{t['name']}.yaml": File(dump(t)) for t in tasks}, tasks, notes)

    def apply(self, artifacts: Artifacts, job, spec, opts: SkyFlags, ctx: ApplyContext) -> Applied:
        out = super().apply(artifacts, job, spec, opts, ctx)
        if opts.submit:
            launched = []
            for path in out.written:
                name = os.path.basename(path)[:-len(".yaml")]
                if not job.serve:  # a held cluster is recorded as one (`down` removes it)
                    ctx.launching([name])
                job_id = held.launch(path, name, ctx.env or dict(os.environ), need_id=job.serve,
                                     down_after=not job.serve, remove_hint=self._remove_hint(job))
                launched.append(name)
                ctx.progress(f"launched SkyPilot cluster {name}" + (f" (job {job_id})" if job_id else "")
                             + ("" if job.serve else "; SkyPilot removes it when its job ends"))
                if job.serve:
                    out.held = held.wait_serving(name, job_id, job.nodes, job.name, ctx.env or dict(os.environ),
                                                    ctx.progress)
            out.launched = launched
        return out

    @staticmethod
    def _remove_hint(job: JobSpec) -> str:
        """What removes a cluster whose launch failed: a one-off job's is recorded (destroy); a held
        cluster is recorded only once it serves, so only `sky down` knows it."""
        return "" if job.serve else hint.cmd(f"destroy --target skypilot --name {job.name}")

    def destroy(self, spec: ClusterSpec, name: str, launched: list[str]) -> Destroyed:
        """`sky down -y` of exactly the clusters recorded as launched under NAME (a cluster SkyPilot already
        removed after its job is said to be gone, not an error)."""
        if not launched:
            raise DeployError(f"--target skypilot --name {name}: no launched clusters are recorded for this name "
                              "(build/launched.json); `sky status` lists what SkyPilot runs, `sky down NAME` "
                              "removes one")
        had = held.down_clusters(launched, dict(os.environ))
        said = (f"removed SkyPilot cluster(s) {', '.join(launched)}" if had else
                f"SkyPilot no longer has {', '.join(launched)} (removed after their jobs ended, or by hand)")
        return Destroyed(name, said, list(launched))

    # a held cluster is the launched cluster and its serving job (deploy/targets/skypilot/held.py)
    handle = SkyHandle
    held = held


TARGET = SkyPilot()

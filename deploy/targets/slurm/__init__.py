"""`--target slurm`: a plain sbatch script; the job runs in the nodes' own environment (no image).

The spec's `slurm.env_setup` lines (module load, venv activation) run first; without them the job
uses the environment sbatch exports from the submitting shell. Partition and account are optional
(Slurm has a default partition): `slurm.partition`/`slurm.account`, or `--partition`/`--account`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import Field

from deploy.handles import SlurmHandle
from deploy.targets.slurm import held, sbatch
from deploy.job import JobSpec
from deploy.targets.base import Applied, ApplyContext, Artifacts, File, Target, TargetOptions
from runtime.spec import SLURM_NAME, ClusterSpec, SlurmOptions as SpecSlurm


class SlurmFlags(TargetOptions):
    """slurm's options (pyxis takes them too); each description is its flag's help."""
    partition: Optional[str] = Field(None, pattern=SLURM_NAME, description=(
        "Slurm partition (overrides slurm.partition; default: the cluster's default partition)."))
    account: Optional[str] = Field(None, pattern=SLURM_NAME, description="Slurm account (overrides slurm.account).")
    port_stride: int = Field(0, ge=0, le=1000, description=(
        "offset between the Ray ports of nodes that share a host (several slurmd per host)."))
    spare_nodes: int = Field(0, ge=0, le=64, description=(
        "allocate this many nodes beyond --nodes, with --no-kill: a node that fails leaves the job, and the "
        "worker group moves its ranks onto a spare without a requeue (default 0: a failed node requeues the "
        "whole job, which resumes its run from the checkpoint)."))


def spec_section(spec: ClusterSpec) -> SpecSlurm:
    return spec.slurm or SpecSlurm()


def partition_account(spec: ClusterSpec, opts: SlurmFlags) -> tuple[Optional[str], Optional[str]]:
    section = spec_section(spec)
    return opts.partition or section.partition, opts.account or section.account


def slurm_problems(job: JobSpec, spec: ClusterSpec, opts: SlurmFlags) -> list[str]:
    problems = sbatch.directive_problems(job, *partition_account(spec, opts))
    section = spec_section(spec)
    if job.gpus_per_node and section.gpus_per_node and job.gpus_per_node != section.gpus_per_node:
        problems.append(f"--gpus: the job asks for {job.gpus_per_node} GPUs per node, the spec's slurm.gpus_per_node "
                        f"is {section.gpus_per_node}; make them agree")
    return problems


def slurm_notes(job: JobSpec, spec: ClusterSpec, opts: SlurmFlags) -> list[str]:
    partition, _ = partition_account(spec, opts)
    notes = [] if partition else ["no partition given (slurm.partition or --partition): Slurm uses the cluster's default"]
    if not opts.submit:
        notes.append(f"to submit by hand: mkdir -p {sbatch.log_dir(job)} first (Slurm opens --output before the "
                     "script runs); --submit does it")
    return notes


def submit(artifacts: Artifacts, job: JobSpec, ctx: ApplyContext, container: bool = False) -> Applied:
    """sbatch the script; for a held cluster, wait until its head serves (CONTAINER: in Pyxis' named
    container, which runs attach to)."""
    written = ctx.write(artifacts)
    job_id = sbatch.submit(written[0], job, env=ctx.env)
    ctx.progress(f"submitted Slurm job {job_id}; its output: {sbatch.log_dir(job) / f'{job.name}-{job_id}.out'}")
    return Applied(written=[str(w) for w in written], slurm_job_id=job_id,
                   held=held.wait_serving(job, job_id, ctx.env, ctx.progress, container=container) if job.serve else None)


class SlurmJobTarget(Target):
    """A target whose held cluster is one running Slurm job (deploy/targets/slurm/held.py): plain and Pyxis."""
    handle = SlurmHandle
    held = held

    def port_stride(self, opts: SlurmFlags) -> int:
        return opts.port_stride


class Slurm(SlurmJobTarget):
    name = "slurm"
    summary = "plain sbatch: Ray head + workers over srun in the nodes' own environment (slurm.env_setup)"
    Options = SlurmFlags
    needs_image = False

    def spec_gpus(self, spec: ClusterSpec) -> int:
        return spec_section(spec).gpus_per_node

    def job_workdir(self, app_dir: Path) -> Optional[str]:
        return str(app_dir.resolve())

    def preflight(self, job, spec, opts) -> list[str]:
        return slurm_problems(job, spec, opts)

    def render(self, job: JobSpec, spec: ClusterSpec, opts: SlurmFlags) -> Artifacts:
        partition, account = partition_account(spec, opts)
        section = spec_section(spec)
        script = sbatch.render(job, partition=partition, account=account, env_setup=section.env_setup,
                               port_stride=opts.port_stride, spare_nodes=opts.spare_nodes)
        notes = slurm_notes(job, spec, opts)
        if not section.env_setup:
            notes.append("slurm.env_setup is empty: the job runs `python -m runtime` from the environment sbatch "
                         "exports (activate the runtime's venv before submitting, or add env_setup lines)")
        return Artifacts({f"{job.name}.sbatch": File(script, 0o755)}, [script], notes)

    def apply(self, artifacts, job, spec, opts, ctx) -> Applied:
        if opts.submit:
            return submit(artifacts, job, ctx)
        return super().apply(artifacts, job, spec, opts, ctx)


TARGET = Slurm()

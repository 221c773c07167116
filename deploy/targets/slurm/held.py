"""A held cluster on Slurm (plain or Pyxis): the job `invoke up` submitted, its head serving drivers.

    wait_serving  after sbatch: the job's output says the head serves (or the job ended: its log)
    run           `srun --jobid J --overlap -w HEAD python -m runtime run --unpack-stdin /tmp`, the
                  code as a tar on the step's stdin: unpacked once on the head (by its hash) and handed
                  to the head (runtime/cluster/serving.py), whose own environment holds the job's Ray token:
                  nothing secret leaves the job. With Pyxis the step attaches to the head's running
                  container (`--container-name=raytrain-head-J:exec`: its namespaces, so its /tmp and
                  socket), without importing the image again
    status        squeue's state of the job
    down          `python -m runtime stop` in a step on the head: it stops serving and publishes 0, the
                  nodes leave in order, the script removes the head's named container (Pyxis) and ends;
                  `scancel --signal=TERM` of the steps if the head cannot be asked, scancel after GRACE_S
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

from deploy import commands, held_step
from deploy.handles import ClusterStatus, SlurmHandle
from deploy.job import DeployError, JobSpec
from deploy.targets.slurm.sbatch import head_container
from runtime import contract as C
from runtime.contract import head_of, is_serving
from runtime.wait import holds_within, wait_until

GRACE_S = 120  # how long down waits for the job to end on its own before it cancels it


def _cli(argv: list[str], env: dict, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return commands.run(argv, "run on a Slurm login node", env, timeout_s, slow="is slurmctld answering (`scontrol ping`)?")


ENDED = ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")  # squeue's states of a job that is over ('': no longer listed)


def ended(st: str) -> bool:
    return st in ENDED


def state(job_id: str, env: dict) -> str:
    """squeue's state of the job ('' once it has left the queue)."""
    return _cli(["squeue", "-h", "-j", job_id, "-o", "%T"], env).stdout.strip()


def wait_serving(job: JobSpec, job_id: str, env: dict, progress: Callable[[str], None], timeout_s: float = 600,
                 container: bool = False) -> SlurmHandle:
    """The handle once the job's head serves; if the job ends first, its log's last lines. CONTAINER:
    the head runs in Pyxis' named container (deploy/sbatch.head_container)."""
    log = Path(job.fileroot) / "logs" / f"{job.name}-{job_id}.out"
    progress(f"slurm: waiting for job {job_id} to start and its head to serve ({log})")

    def text() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    def serving():
        if ended(state(job_id, env)):
            raise DeployError(f"Slurm job {job_id} ended before its head served:\n    "
                              + "\n    ".join(text().splitlines()[-15:]))
        t = text()
        return head_of(t) if is_serving(t) else None
    try:
        head = wait_until(serving, timeout_s=timeout_s, interval_s=0.5, what=f"Slurm job {job_id}'s head to serve",
                          hint="the job may be pending (squeue) or its nodes may not form a cluster",
                          logs=lambda: "\n    ".join(text().splitlines()[-15:]))
    except BaseException:
        _cli(["scancel", job_id], env)
        raise
    return SlurmHandle(job_id=job_id, head_node=head, log=str(log), job_name=job.name,
                       container=head_container(job_id) if container else None)


def status(handle: SlurmHandle, env: dict) -> ClusterStatus:
    return _status(handle, state(handle.job_id, env))


def status_many(handles: list[SlurmHandle], env: dict) -> list[ClusterStatus]:
    """The status of every held job from one squeue call (one call per record took over 60 s for 400)."""
    if not handles:
        return []
    ids = ",".join(dict.fromkeys(h.job_id for h in handles))
    listed = _cli(["squeue", "-h", "-j", ids, "-o", "%i %T"], env).stdout
    states = dict(line.split(None, 1) for line in listed.splitlines() if len(line.split(None, 1)) == 2)
    return [_status(h, states.get(h.job_id, "").strip()) for h in handles]


def _status(handle: SlurmHandle, st: str) -> ClusterStatus:
    return ClusterStatus(st == "RUNNING", {f"job {handle.job_id} (head {handle.head_node})": st or "gone"})


def _on_head(handle: SlurmHandle, run_env: dict) -> list[str]:
    """An srun step on the held cluster's head (inside its container, with Pyxis)."""
    exports = ",".join(["ALL", *(f"{k}={v}" for k, v in sorted(run_env.items()))])
    step = ["srun", f"--jobid={handle.job_id}", "--overlap", "--nodes=1", "--ntasks=1", "-w", handle.head_node,
            f"--export={exports}"]
    if handle.container:  # join the head's running container; its image's variables lose to these
        step.append(f"--container-name={handle.container}:exec")
        if run_env:
            step.append("--container-env=" + ",".join(sorted(run_env)))
    return step


def run_step(handle: SlurmHandle, rel_dir: str, argv: list[str], run_env: dict) -> list[str]:
    """The srun step that runs ARGV on the held cluster's head, its code coming on stdin."""
    return [*_on_head(handle, run_env), *held_step.runtime_run(rel_dir, argv)]


def run(handle: SlurmHandle, env: dict, code_tar: bytes, rel_dir: str, argv: list[str], run_env: dict, out=None) -> int:
    return held_step.stream(run_step(handle, rel_dir, argv, run_env), env, code_tar, out,
                            "run on a Slurm login node")


def _gone(job_id: str, env: dict, timeout_s: float) -> bool:
    return holds_within(lambda: ended(state(job_id, env)), timeout_s=timeout_s, interval_s=0.5,
                        what=f"Slurm job {job_id} to end")


def down(handle: SlurmHandle, env: dict, timeout_s: float = 120) -> list[str]:
    """Ask the head to stop (`python -m runtime stop` in a step on it): it publishes exit code 0, the
    nodes leave in order, the script cleans up and the job ends COMPLETED, with no signal to any of
    the job's processes (Slurm would signal every one of them, and each Ray process would report the
    others' deaths). If the head cannot be asked, the steps get SIGTERM; a job still there after
    GRACE_S is cancelled."""
    job_id = handle.job_id
    try:
        asked = _cli(_on_head(handle, {C.JOB_NAME: handle.job_name}) + held_step.runtime_stop(), env).returncode == 0
    except DeployError:  # the step did not finish in time: the steps get SIGTERM, as when the head cannot be asked
        asked = False
    if not asked:
        _cli(["scancel", "--signal=TERM", job_id], env)
    if not _gone(job_id, env, GRACE_S):
        _cli(["scancel", job_id], env)
        _gone(job_id, env, timeout_s)
    return [f"Slurm job {job_id}"]

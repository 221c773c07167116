"""A held cluster on Slurm: the job `invoke up` submitted, with its head serving drivers.

    wait_serving  after sbatch: the job's output says the head serves (or the job ended: its log)
    run           the code unpacked on the shared fileroot; `srun --jobid J --overlap -w HEAD
                  python -m runtime run` hands the driver to the head (runtime/serving.py), whose
                  own environment holds the job's Ray token: nothing secret leaves the job
    status        squeue's state of the job
    down          scancel: the head stops serving, the nodes leave, Slurm ends the job

The fileroot is shared by the login node and the compute nodes (Slurm writes the job's output
there already), so the code of each run goes to <fileroot>/raytrain-code/<hash>/ once.
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

from deploy.job import DeployError, JobSpec
from runtime import contract as C
from runtime import log_relay
from runtime.serving import SERVING_LINE
from runtime.wait import wait_until

HEAD_LINE = re.compile(r"raytrain: job (\S+) head (\S+) ")  # what the sbatch script echoes (deploy/sbatch.py)


def _cli(argv: list[str], env: dict, timeout_s: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError:
        raise DeployError(f"{argv[0]} is not on PATH: run on a Slurm login node") from None


def state(job_id: str, env: dict) -> str:
    """squeue's state of the job ('' once it has left the queue)."""
    return _cli(["squeue", "-h", "-j", job_id, "-o", "%T"], env).stdout.strip()


def wait_serving(job: JobSpec, job_id: str, env: dict, progress: Callable[[str], None], timeout_s: float = 600) -> dict:
    """The handle once the job's head serves; if the job ends first, its log's last lines."""
    log = Path(job.fileroot) / "logs" / f"{job.name}-{job_id}.out"
    progress(f"slurm: waiting for job {job_id} to start and its head to serve ({log})")

    def text() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    def serving():
        if state(job_id, env) in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            raise DeployError(f"Slurm job {job_id} ended before its head served:\n    "
                              + "\n    ".join(text().splitlines()[-15:]))
        t = text()
        head = HEAD_LINE.search(t)
        return head.group(2) if head and SERVING_LINE in t else None
    try:
        head = wait_until(serving, timeout_s=timeout_s, interval_s=0.5, what=f"Slurm job {job_id}'s head to serve",
                          hint="the job may be pending (squeue) or its nodes may not form a cluster",
                          logs=lambda: "\n    ".join(text().splitlines()[-15:]))
    except BaseException:
        _cli(["scancel", job_id], env)
        raise
    return {"job_id": job_id, "head_node": head, "log": str(log), "code_root": str(Path(job.fileroot)),
            "job_name": job.name}


def status(handle: dict, env: dict) -> dict:
    st = state(handle["job_id"], env)
    return {"up": st == "RUNNING", "nodes": {f"job {handle['job_id']} (head {handle['head_node']})": st or "gone"}}


def run(handle: dict, env: dict, code_tar: bytes, rel_dir: str, argv: list[str], run_env: dict, out=None) -> int:
    out = out or sys.stdout
    root = Path(handle["code_root"])
    code_dir = root / rel_dir
    if not code_dir.is_dir():  # content-addressed: a version already there is the same bytes
        with tarfile.open(fileobj=io.BytesIO(code_tar)) as tf:
            tf.extractall(root, filter="data")
    exports = ",".join(["ALL", *(f"{k}={v}" for k, v in sorted(run_env.items()))])
    step = ["srun", f"--jobid={handle['job_id']}", "--overlap", "--nodes=1", "--ntasks=1", "-w", handle["head_node"],
            f"--export={exports}", *C.RUNTIME_CMD, "run", "--code-dir", str(code_dir), "--", *argv]
    try:
        proc = subprocess.Popen(step, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise DeployError("srun is not on PATH: run on a Slurm login node") from None
    log_relay.prefixed(proc.stdout, "run", out)
    return proc.wait()


def down(handle: dict, env: dict, timeout_s: float = 120) -> list[str]:
    _cli(["scancel", handle["job_id"]], env)
    deadline = time.monotonic() + timeout_s
    while state(handle["job_id"], env) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"Slurm job {handle['job_id']}"]

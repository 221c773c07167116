"""A held cluster on SkyPilot: the cluster `invoke up` launched and the job on it that holds its
nodes, whose head serves drivers. Everything goes through the `sky` CLI; SkyPilot's job queue on
the cluster runs each step beside the held job.

    launch        `sky launch -y -d -c NAME --secret RAY_AUTH_TOKEN TASK` (the file deploy writes; with
                  up every node runs `--serve`); the job id from its "Job submitted, ID: N" line
    wait_serving  `sky logs NAME J --status` (has the job ended?) and `sky logs NAME J --no-follow`
                  until the head says it serves; a job that ends first is said with its log, one
                  that does not serve in time is cancelled
    run           `sky exec NAME RUN_TASK`: a task over the cluster's nodes that asks for no
                  accelerators (SkyPilot's default demand, half a CPU per node), so the queue starts it
                  beside the held job, which holds the accelerators. Its workdir holds the code's tar
                  only: SkyPilot syncs it to ~/sky_workdir on the nodes (its own mechanism, no hand-made
                  sync), and rank 0, the cluster's head as for the held job (deploy/targets/skypilot/task.py), hands
                  it to `python -m runtime run --unpack-stdin /tmp` as every other target does; the
                  other nodes have nothing to do. `sky exec` follows the job's log and exits with 0 when
                  it succeeded
    status        `sky logs NAME J --status`: whether the held job is still running
    down          a task like run's with `python -m runtime stop` on rank 0: the head stops serving and
                  publishes 0, the nodes leave and the held job ends SUCCEEDED (`sky cancel` if it is
                  still there after GRACE_S); then `sky down -y NAME` removes the cluster
"""
from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from deploy import commands, held_step
from deploy.handles import ClusterStatus, SkyHandle
from deploy.job import DeployError
from deploy.targets.skypilot.task import IMAGE_ENV, by_rank, dump
from runtime import contract as C
from runtime.cluster.log_relay import ANSI
from runtime.contract import is_serving
from runtime.wait import holds_within, wait_until

GRACE_S = 120  # how long down waits for the held job to end on its own before it cancels it
MISSING = "install SkyPilot (`pip install skypilot`) and check the cloud with `sky check`"
# what `sky launch` prints of the job it submitted: its closing hint ("Job ID: N", then how to cancel
# it), and the backend's "Job submitted, ID: N" as it streams the launch
JOB_ID = re.compile(r"^(?:Job ID: |\S* ?Job submitted, ID: )([0-9]+)\s*$", re.M)
LOG_TAIL = 300
# `sky logs CLUSTER JOB --status` exits with the job's state, `sky exec` with its job's when it ends
# (sky.exceptions.JobExitCode)
JOB_STATES = {0: "SUCCEEDED", 100: "FAILED", 101: "RUNNING", 102: "NOT FOUND", 103: "CANCELLED"}
NOT_FINISHED = 101
CODE_TAR = "raytrain-code.tar"  # the run task's one workdir file


def _plain(text: str) -> str:
    """TEXT without the ANSI codes SkyPilot colours its output with."""
    return ANSI.sub(b"", text.encode()).decode(errors="replace")


def said(res: subprocess.CompletedProcess) -> str:
    """What a `sky` command printed, both streams (SkyPilot says most on stdout)."""
    return _plain(res.stdout + "\n" + res.stderr).strip()


def _tail(res: subprocess.CompletedProcess, lines: int = 10) -> str:
    return "\n    ".join(said(res).splitlines()[-lines:])


def _cli(argv: list[str], env: Optional[dict], timeout_s: float = 600) -> subprocess.CompletedProcess:
    return commands.run(argv, MISSING, env, timeout_s, slow="`sky api info` says whether SkyPilot's API server "
                        "answers, `sky api status` what it is doing")


def launch_argv(task_file: str, cluster: str, down_after: bool = False) -> list[str]:
    """DOWN_AFTER: SkyPilot removes the cluster once its jobs end (a one-off job; a held cluster stays)."""
    return ["sky", "launch", "-y", "-d", *(["--down"] if down_after else []), "-c", cluster,
            "--secret", C.AUTH_TOKEN, task_file]


def exec_argv(task_file: str, cluster: str) -> list[str]:
    return ["sky", "exec", cluster, task_file]


def status_argv(cluster: str, job_id: str) -> list[str]:
    return ["sky", "logs", "--status", cluster, job_id]


def log_argv(cluster: str, job_id: str) -> list[str]:
    """The log so far, its last LOG_TAIL lines (the serving line is the newest while up waits for it)."""
    return ["sky", "logs", "--no-follow", "--tail", str(LOG_TAIL), cluster, job_id]


def cancel_argv(cluster: str, job_id: str) -> list[str]:
    return ["sky", "cancel", "-y", cluster, job_id]


def down_argv(*clusters: str) -> list[str]:
    return ["sky", "down", "-y", *clusters]


NONE_FOUND = "Cluster(s) not found"  # what `sky down` says (exit 0) when it has none of the names


def down_clusters(clusters: list[str], env: Optional[dict]) -> bool:
    """`sky down -y` of exactly CLUSTERS (names of [a-z0-9-]: no glob SkyPilot would expand); False when
    SkyPilot had none of them any more (removed after their jobs, or by hand)."""
    res = _cli(down_argv(*clusters), env, timeout_s=1800)
    if res.returncode != 0:
        raise DeployError(f"sky down {' '.join(clusters)} failed ({res.returncode}); they may still run: "
                          f"`sky status`:\n    {_tail(res)}")
    return NONE_FOUND not in said(res)


def launch(task_file: str, cluster: str, env: dict, need_id: bool = False, down_after: bool = False,
           remove_hint: str = "") -> Optional[str]:
    """Launch TASK_FILE on CLUSTER with a fresh Ray token (a secret: never in the file); its job id
    (None if its output names none, an error when NEED_ID: a held cluster is that job). A launch that
    fails may leave the cluster (SkyPilot keeps a failed setup for debugging): the error says how to
    remove it (REMOVE_HINT, and `sky down`)."""
    res = _cli(launch_argv(task_file, cluster, down_after), {**env, C.AUTH_TOKEN: secrets.token_hex(32)},
               timeout_s=3600)
    if res.returncode != 0:
        remove = f"`{remove_hint}` or " if remove_hint else ""
        raise DeployError(f"sky launch {task_file} failed ({res.returncode}):\n    {_tail(res)}\n"
                          f"  if SkyPilot made the cluster (it keeps one whose setup failed, to debug it: `sky status "
                          f"{cluster}`), {remove}`sky down -y {cluster}` removes it")
    job_id = job_id_from(said(res))
    if job_id is None and need_id:
        raise DeployError(f"sky launch {task_file}: its output names no job ('Job ID: N'); see `sky queue "
                          f"{cluster}`:\n    {_tail(res)}")
    return job_id


def job_id_from(text: str) -> Optional[str]:
    """The job id `sky launch` printed (TEXT, without ANSI codes), or None."""
    found = JOB_ID.findall(text)
    return found[-1] if found else None


def job_state(cluster: str, job_id: str, env: Optional[dict]) -> tuple[int, str]:
    """(`sky logs --status`'s exit code, its name: RUNNING covers pending and setting up as well)."""
    res = _cli(status_argv(cluster, job_id), env, timeout_s=120)
    return res.returncode, JOB_STATES.get(res.returncode, f"unknown (sky logs --status exited {res.returncode}: "
                                                          f"{said(res)[-200:]})")


def job_log(cluster: str, job_id: str, env: Optional[dict]) -> str:
    res = _cli(log_argv(cluster, job_id), env, timeout_s=120)
    return _plain(res.stdout)


def wait_serving(cluster: str, job_id: str, nodes: int, job_name: str, env: dict,
                 progress: Callable[[str], None], timeout_s: float = 1800) -> SkyHandle:
    """The handle once the held job's head serves. A job that ends first is said with its log's last
    lines; one that does not serve in time is cancelled; the cluster stays (`sky down` removes it)."""
    progress(f"skypilot: waiting for job {job_id} on {cluster} to start and its head to serve")
    last = {"log": "", "ended": False}

    def serving() -> bool:
        code, state = job_state(cluster, job_id, env)
        last["log"] = job_log(cluster, job_id, env)
        if code != NOT_FINISHED:
            last["ended"] = True
            raise DeployError(f"SkyPilot job {job_id} on {cluster} is {state} before its head served:\n    "
                              + "\n    ".join(last["log"].splitlines()[-15:]))
        return is_serving(last["log"])
    try:
        wait_until(serving, timeout_s=timeout_s, interval_s=2, what=f"SkyPilot job {job_id}'s head to serve",
                   hint=f"see `sky queue {cluster}`", logs=lambda: "\n    ".join(last["log"].splitlines()[-15:]))
    except BaseException:
        if not last["ended"]:
            _cli(cancel_argv(cluster, job_id), env, timeout_s=120)
        progress(f"skypilot: job {job_id} is not running; `sky down {cluster}` removes the cluster")
        raise
    return SkyHandle(cluster=cluster, job_id=job_id, nodes=nodes, job_name=job_name)


def status(handle: SkyHandle, env: Optional[dict]) -> ClusterStatus:
    code, state = job_state(handle.cluster, handle.job_id, env)
    return ClusterStatus(code == NOT_FINISHED, {f"cluster {handle.cluster} job {handle.job_id}": state})


def step_task(handle: SkyHandle, what: str, argv: list[str], run_env: dict, workdir: Optional[str] = None) -> dict:
    """A task (named for WHAT it does) over every node of the held cluster that runs ARGV on rank 0
    (the head) with RUN_ENV and asks for nothing the held job holds; with WORKDIR, rank 0 reads
    CODE_TAR from it on stdin."""
    task = {"name": f"{handle.job_name}-{what}", "num_nodes": handle.nodes,
            "envs": {**IMAGE_ENV, **dict(sorted(run_env.items()))}}
    if workdir:
        task["workdir"] = workdir
    task["run"] = by_rank(argv, stdin=CODE_TAR if workdir else None)
    return task


def run(handle: SkyHandle, env: Optional[dict], code_tar: bytes, rel_dir: str, argv: list[str], run_env: dict,
        out=None) -> int:
    """`sky exec` of the run task, its output relayed; 0 when the job succeeded, else `sky exec`'s code
    (the driver's own is in the job's log)."""
    with tempfile.TemporaryDirectory(prefix="raytrain-sky-run-") as tmp:
        workdir = Path(tmp) / "workdir"
        workdir.mkdir()
        (workdir / CODE_TAR).write_bytes(code_tar)
        task_file = Path(tmp) / "run.yaml"
        task_file.write_text(dump(step_task(handle, "run", held_step.runtime_run(rel_dir, argv), run_env, str(workdir))))
        code = held_step.stream(exec_argv(str(task_file), handle.cluster), env, b"", out, MISSING)
    if code and code in JOB_STATES:
        print(f"[run] sky exec: the job is {JOB_STATES[code]}", file=out or sys.stdout, flush=True)
    return code


def _ended(handle: SkyHandle, env: Optional[dict], timeout_s: float) -> bool:
    return holds_within(lambda: job_state(handle.cluster, handle.job_id, env)[0] != NOT_FINISHED,
                        timeout_s=timeout_s, interval_s=2, what=f"SkyPilot job {handle.job_id} to end")


def down(handle: SkyHandle, env: Optional[dict]) -> list[str]:
    """Ask the head to stop (a step like run's: no signal reaches the job's processes), cancel the
    held job if it is still there after GRACE_S, then remove the cluster."""
    cluster, job_id = handle.cluster, handle.job_id
    if status(handle, env).up:
        with tempfile.TemporaryDirectory(prefix="raytrain-sky-stop-") as tmp:
            task_file = Path(tmp) / "stop.yaml"
            task_file.write_text(dump(step_task(handle, "stop", held_step.runtime_stop(), {C.JOB_NAME: handle.job_name})))
            try:
                asked = _cli(exec_argv(str(task_file), cluster), env).returncode == 0
            except DeployError:  # the stop step did not finish in time: the held job is cancelled
                asked = False
        if not asked or not _ended(handle, env, GRACE_S):
            _cli(cancel_argv(cluster, job_id), env, timeout_s=120)
    res = _cli(down_argv(cluster), env, timeout_s=1800)
    if res.returncode != 0:
        raise DeployError(f"sky down {cluster} failed ({res.returncode}); the cluster may still run: "
                          f"`sky status {cluster}`:\n    {_tail(res)}")
    return [f"SkyPilot cluster {cluster} (job {job_id})"]

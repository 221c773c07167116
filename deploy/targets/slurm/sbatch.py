"""The sbatch script both Slurm targets render (plain and Pyxis), and its submission.

`render()` is a pure function from the job to the script's text (the dry run prints it);
`submit()` hands a written script to `sbatch`. Every value that reaches the shell goes through
`shlex.quote`/`shlex.join`; `#SBATCH` lines, which Slurm parses itself, only take values from a
safe character set and anything else is a pre-flight problem (`directive_problems`).

Layout of the job (the runtime's barrier replaces the seed walkthrough's sleeps):
  1. the head's IP, asked on the head node with `hostname --ip-address`;
  2. one `srun` step for the head (driver command), one for all workers, both in the
     background with `--kill-on-bad-exit`; the workers' step numbers its nodes from 0, so it
     passes the rank offset 1;
  3. the script exits with the head's code, and requeues itself while retries are left.
Node failure: `--requeue` always (Slurm requeues the job when a node fails; the script keeps its
run id, so the run resumes from its checkpoint). With `spare_nodes` N the allocation holds N more
nodes than the training uses and `--no-kill`: a failed node leaves the allocation, the workers'
step goes on without it (`srun --no-kill`, no kill-on-bad-exit), and the worker group moves the
lost node's ranks onto a spare without a requeue (RAYTRAIN_TRAIN_NODES tells the driver how many
nodes to train on; the barrier waits for all of them).
With Pyxis the container flags go on each `srun`, never on `#SBATCH` (there Pyxis would run
the batch script itself in the container, and the nested srun would fail).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Optional, Sequence

from deploy import commands
from deploy.job import DeployError, JobSpec
from runtime import contract as C

SAFE_DIRECTIVE = re.compile(r"[A-Za-z0-9_./:@+=-]+")  # always fullmatch: `$` would let a trailing newline in
# Generated at run time in the job, kept in its environment only: never in the script or a log.
# xtrace (`set -x` in env_setup) is off while it is made, so the value is not traced into the log.
TOKEN_LINES = [
    'case $- in *x*) _rt_xtrace=1; set +x;; *) _rt_xtrace=;; esac',
    f"export {C.AUTH_TOKEN}=\"$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')\"",
    '[ -z "$_rt_xtrace" ] || set -x',
]


HEAD_CONTAINER = "raytrain-head-"  # + the Slurm job id: a held Pyxis head's named container


def head_container(job_id: str) -> str:
    """The Pyxis container name of a held cluster's head: `invoke run`'s step attaches to it
    (`--container-name=NAME:exec` joins the running container's namespaces, so it reaches the head's
    socket and /tmp). Named by job id: with Pyxis' default container_scope=global a name outlives
    its job, and a later job must never reuse another's root filesystem."""
    return HEAD_CONTAINER + job_id


def squashfs_ref(path: str) -> str:
    """Pyxis takes a .sqsh by absolute path or a ./-relative one; anything else it reads as an image name."""
    if not (path.startswith("/") or path.startswith("./")) or not path.endswith(".sqsh") or "," in path:
        raise DeployError(f"squashfs image {path!r} must be an absolute or ./-prefixed path ending in .sqsh, without ','")
    return path


def directives(job: JobSpec, partition: Optional[str], account: Optional[str],
               spare_nodes: int = 0) -> list[tuple[str, str]]:
    out = [("--job-name", job.name), ("--nodes", str(job.nodes + spare_nodes)), ("--ntasks-per-node", "1"),
           ("--cpus-per-task", str(job.cpus_per_node)), ("--time", job.time_limit),
           ("--output", f"{job.fileroot}/logs/{job.name}-%j.out"), ("--open-mode", "append")]
    if partition:
        out.append(("--partition", partition))
    if account:
        out.append(("--account", account))
    if job.gpus_per_node:
        out.append(("--gpus-per-node", str(job.gpus_per_node)))
    if job.memory:
        out.append(("--mem", job.memory))
    return out


def directive_problems(job: JobSpec, partition: Optional[str], account: Optional[str]) -> list[str]:
    """Values Slurm would read differently on an #SBATCH line (it does not unquote them)."""
    return [f"{flag}={value!r} cannot go on an #SBATCH line (Slurm does not unquote it); use letters, digits and "
            ". _ / : @ + = -" for flag, value in directives(job, partition, account)
            if not SAFE_DIRECTIVE.fullmatch(value.replace("%j", "", 1) if flag == "--output" else value)]


def container_flags(job: JobSpec, image: str, mount_home: bool = False) -> list[str]:
    flags = [f"--container-image={image}"]
    if job.mounts:
        flags.append("--container-mounts=" + ",".join(m.as_string() for m in job.mounts))
    if job.workdir:
        flags.append(f"--container-workdir={job.workdir}")
    if not mount_home:
        flags.append("--no-container-mount-home")
    # these must beat whatever the image's /etc/environment says
    names = [C.AUTH_TOKEN, C.HEAD_ADDRESS, C.NUM_NODES, C.TRAIN_NODES, C.JOB_NAME, *sorted(job.env)]
    flags.append("--container-env=" + ",".join(names))
    return flags


def render(job: JobSpec, *, partition: Optional[str] = None, account: Optional[str] = None,
           env_setup: Sequence[str] = (), image: Optional[str] = None, port_stride: int = 0,
           mount_home: bool = False, spare_nodes: int = 0) -> str:
    """The sbatch script. `image` is a Pyxis image reference (registry#repo@digest or a .sqsh path);
    None = plain: `env_setup` (shell lines from the spec, run as written) prepares the nodes' environment."""
    problems = directive_problems(job, partition, account)
    if problems:
        raise DeployError("; ".join(problems))
    lines = ["#!/bin/bash",
             *(f"#SBATCH {flag}={value}" for flag, value in directives(job, partition, account, spare_nodes)),
             "#SBATCH --requeue"]  # a failed node (or preemption) requeues the job; it resumes its run
    if spare_nodes:
        lines.append("#SBATCH --no-kill")  # a failed node leaves the allocation; the spares take its ranks
    # the image reference is quoted like every other value: a recorded digest is input too
    lines += [f"# generated by raytrain for job {job.name}",
              f"# Slurm opens --output before this runs: `mkdir -p {shlex.quote(str(log_dir(job)))}` before sbatch "
              "(invoke deploy --submit does)",
              f"RAYTRAIN_IMAGE={shlex.quote(image or 'none (plain: the nodes environment)')}",
              "set -euo pipefail", ""]
    if env_setup and not image:
        lines.append("# environment setup from the cluster spec (slurm.env_setup), run as written")
        lines += list(env_setup)
        lines.append("")
    if job.workdir and not image:
        lines.append(f"cd {shlex.quote(job.workdir)}")
    for k, v in sorted(job.env.items()):
        lines.append(f"export {k}={shlex.quote(v)}")
    lines += [*TOKEN_LINES,
              'mkdir -p ' + shlex.quote(f"{job.fileroot}/logs"),
              'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
              'head_node="${nodes[0]}"',
              'head_ip="$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk \'{print $1}\')"',
              f'export {C.HEAD_ADDRESS}="$head_ip" {C.NUM_NODES}={job.nodes + spare_nodes} '
              f'{C.TRAIN_NODES}={job.nodes} {C.JOB_NAME}={shlex.quote(job.name)}',
              C.head_line_echo(job.nodes, spare_nodes), ""]
    ctr = container_flags(job, image, mount_home) if image else []
    head = ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", f"--export=ALL,{C.NODE_RANK}=0", *ctr]
    named = image and job.serve  # a held head's container, which `invoke run` attaches to
    lines.append(shlex.join(head) + (f' "--container-name={HEAD_CONTAINER}$SLURM_JOB_ID"' if named else "")
                 + ' -w "$head_node" ' + shlex.join(job.launch_argv(port_stride, driver=True)) + " &")
    lines.append("head_pid=$!")
    others = job.nodes - 1 + spare_nodes
    if others:
        # with spares a lost worker node must not take the step down: the group replaces it
        survive = ["--no-kill", "--kill-on-bad-exit=0"] if spare_nodes else ["--kill-on-bad-exit=1"]
        workers = ["srun", f"--nodes={others}", f"--ntasks={others}", "--ntasks-per-node=1",
                   *survive, f"--export=ALL,{C.NODE_RANK_OFFSET}=1", *ctr]
        lines.append(shlex.join(workers) + ' --exclude="$head_node" ' + shlex.join(job.launch_argv(port_stride)) + " &")
        lines.append("workers_pid=$!")
    lines += ["rc=0", 'wait "$head_pid" || rc=$?']
    if others:
        lines += ["# workers follow the head and leave with its code; stop them if they have not within 60 s",
                  'for _ in $(seq 60); do kill -0 "$workers_pid" 2>/dev/null || break; sleep 1; done',
                  'kill "$workers_pid" 2>/dev/null || true',
                  'wrc=0',
                  'wait "$workers_pid" || wrc=$?',
                  'echo "raytrain: workers step exited with $wrc"']
    if named:
        # Pyxis removes a named container at the job's end only with container_scope=job; under the
        # default (global) its root filesystem would stay on the node. `invoke down` signals the steps
        # (the head leaves with 0), so this runs; a job killed at its time limit cannot run it.
        lines += ["# the head's named container: removed here unless Pyxis (container_scope=job) does it",
                  'srun --overlap --nodes=1 --ntasks=1 -w "$head_node" sh -c '
                  + shlex.quote('enroot list 2>/dev/null | grep -qx "$0" && enroot remove -f "$0" >/dev/null; true')
                  + f' "pyxis_{HEAD_CONTAINER}$SLURM_JOB_ID" || true']
    if job.retries:
        lines += [f'if [ "$rc" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {job.retries} ]; then',
                  '  echo "raytrain: driver exited with $rc; requeueing (restart ${SLURM_RESTART_COUNT:-0})"',
                  '  scontrol requeue "$SLURM_JOB_ID"',
                  "fi"]
    lines += ['echo "raytrain: head exited with $rc"', 'exit "$rc"', ""]
    return "\n".join(lines)


def log_dir(job: JobSpec) -> Path:
    return Path(job.fileroot) / "logs"


def submit(script: Path, job: JobSpec, env: Optional[dict] = None) -> str:
    """`sbatch --parsable SCRIPT` -> the job id; sbatch's own message on failure.

    Slurm opens --output before the script runs, so its directory under fileroot (shared by
    the login and compute nodes) is made here first.
    """
    try:
        log_dir(job).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DeployError(f"cannot create the job's log directory {log_dir(job)}: {e}; is fileroot mounted here?") from None
    res = commands.run(["sbatch", "--parsable", str(script)], "run on a Slurm login node, or deploy without --submit",
                       env, slow="is slurmctld answering (`scontrol ping`)?")
    if res.returncode != 0:
        raise DeployError(f"sbatch {script} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]

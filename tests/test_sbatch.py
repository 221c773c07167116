"""The sbatch renderer without a cluster: Pyxis flags per srun, golden files, hostile values.

The real-Slurm run of the plain script is in test_deploy_slurm.py. Here the rendered script is
checked by bash itself (`bash -n`) and run against stand-in srun/scontrol programs that record
the argv and environment they receive, so a value that the shell re-interprets shows up as a
difference (and the canary file as a side effect).
"""
import json
import os
import shlex
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from deploy.handles import SlurmHandle
from deploy.targets.slurm import sbatch
from deploy.job import DeployError
from helpers import jobs
from helpers.jobs import DIGEST
from runtime.imageref import ImageRef
from runtime.spec import SlurmOptions, load_spec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
PYXIS_IMAGE = ImageRef.parse(DIGEST).pyxis()


def spec_job(spec_name: str, **kw):
    spec = load_spec(ROOT / "cluster_specs" / f"{spec_name}.json")
    job = jobs.job(name="golden", nodes=3, gpus_per_node=spec.slurm.gpus_per_node, cpus_per_node=8,
                   command=["python", "train.py", "--steps", "100"], env={"NCCL_DEBUG": "WARN"}, mounts=spec.mounts,
                   fileroot=spec.fileroot, workdir="/opt/app", time_limit="02:00:00", retries=2, memory="64G", **kw)
    return job, spec.slurm


def render(job, opts: SlurmOptions, image=None, **kw) -> str:
    return sbatch.render(job, partition=opts.partition, account=opts.account, env_setup=opts.env_setup, image=image,
                         **kw)


def srun_lines(script: str) -> list[list[str]]:
    return [shlex.split(l.rstrip(" &")) for l in script.splitlines() if l.startswith("srun ")]


def bash_n(script: str, tmp_path: Path) -> None:
    f = tmp_path / "check.sbatch"
    f.write_text(script)
    res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("spec_name,pyxis", [("slurm-pyxis", True), ("slurm", False)])
def test_golden(spec_name, pyxis, tmp_path):
    job, opts = spec_job(spec_name)
    image = PYXIS_IMAGE if pyxis else None
    script = render(job, opts, image)
    bash_n(script, tmp_path)
    golden = GOLDEN / f"{spec_name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script)
        pytest.skip(f"UPDATE_GOLDEN: rewrote {golden}; review the diff and run again without it")
    assert script == golden.read_text(), f"rendering changed; review and rerun with UPDATE_GOLDEN=1 ({golden})"


def test_pyxis_flags_on_every_role_srun_and_never_on_sbatch(tmp_path):
    job, opts = spec_job("slurm-pyxis")
    script = render(job, opts, PYXIS_IMAGE)
    assert not [l for l in script.splitlines() if l.startswith("#SBATCH") and "container" in l]
    head, workers = srun_lines(script)
    probe = next(l for l in script.splitlines() if "hostname --ip-address" in l)
    assert "--container" not in probe  # the IP probe runs on the host
    expected = {"--container-image=registry.example.com:5000#raytrain-gpu@sha256:" + "ab" * 32,
                "--container-mounts=/storage:/storage", "--container-workdir=/opt/app", "--no-container-mount-home",
                "--container-env=RAY_AUTH_TOKEN,RAYTRAIN_HEAD_ADDRESS,RAYTRAIN_NUM_NODES,RAYTRAIN_TRAIN_NODES,"
                "RAYTRAIN_JOB_NAME,NCCL_DEBUG"}
    for argv in (head, workers):
        assert {a for a in argv if "container" in a} == expected
        assert "--kill-on-bad-exit=1" in argv
    assert head[head.index("--") + 1:] == ["python", "train.py", "--steps", "100"]
    assert "--export=ALL,RAYTRAIN_NODE_RANK_OFFSET=1" in workers and "--nodes=2" in workers
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --partition=gpu" in script
    assert "RAY_AUTH_TOKEN=" not in script.replace("export RAY_AUTH_TOKEN=\"$(", "")  # generated at run time only


def test_a_held_pyxis_head_runs_in_a_container_named_by_its_job_which_runs_attach_to(tmp_path):
    """`invoke up --target pyxis`: only the head's step names its container (by the Slurm job id, so no
    later job reuses its root filesystem), the script removes it after the head leaves, and `invoke
    run`'s step attaches to that running container with the code on its stdin, never importing the
    image again. Plain Slurm: no container anywhere."""
    from deploy.targets.slurm import held as slurm_held
    job, opts = spec_job("slurm-pyxis", serve=True)
    job = job.model_copy(update={"command": ["python", "-m", "runtime", "--unused"]})
    script = render(job, opts, PYXIS_IMAGE)
    bash_n(script, tmp_path)
    head, workers = srun_lines(script)[:2]
    assert "--container-name=raytrain-head-$SLURM_JOB_ID" in head  # expanded by the job's shell
    assert not [a for a in workers if a.startswith("--container-name")]
    assert head[head.index("--serve") + 1:] == []  # a held head runs no driver
    cleanup = next(l for l in script.splitlines() if "enroot remove" in l)
    assert script.index(cleanup) > script.index('wait "$head_pid"') and '"pyxis_raytrain-head-$SLURM_JOB_ID"' in cleanup
    assert "--container" not in cleanup  # on the node, outside the container it removes
    plain = render(job, opts)
    assert "--container" not in plain and "enroot" not in plain

    handle = SlurmHandle(job_id="77", head_node="n1", log="/tmp/logs/job-77.out", job_name="job",
                         container=sbatch.head_container("77"))
    step = slurm_held.run_step(handle, "raytrain-code/abc", ["python", "train.py"], {"RAYTRAIN_RUN_ID": "r1"})
    assert {"--jobid=77", "--overlap", "--container-name=raytrain-head-77:exec",
            "--container-env=RAYTRAIN_RUN_ID", "--export=ALL,RAYTRAIN_RUN_ID=r1"} <= set(step)
    assert not [a for a in step if a.startswith(("--container-image", "--container-mounts"))]
    assert step[step.index("run"):] == ["run", "--code-dir", "/tmp/raytrain-code/abc", "--unpack-stdin", "/tmp", "--",
                                        "python", "train.py"]
    bare = slurm_held.run_step(SlurmHandle(job_id="78", head_node="n1", log="/tmp/logs/job-78.out", job_name="job"),
                               "raytrain-code/abc", ["python"], {})
    assert not [a for a in bare if "container" in a]


def test_node_failure_policy_requeue_or_spares(tmp_path):
    """Always --requeue (a failed node requeues the job, which resumes its run); with spare nodes the
    allocation is larger, --no-kill, and the workers' step survives losing a node."""
    job, opts = spec_job("slurm-pyxis")
    plain = render(job, opts, PYXIS_IMAGE)
    assert "#SBATCH --requeue" in plain and "--no-kill" not in plain
    spared = sbatch.render(job, partition="gpu", image=PYXIS_IMAGE, spare_nodes=2)
    assert "#SBATCH --nodes=5" in spared and "#SBATCH --no-kill" in spared
    assert "RAYTRAIN_NUM_NODES=5 RAYTRAIN_TRAIN_NODES=3" in spared
    head, workers = srun_lines(spared)
    assert "--kill-on-bad-exit=1" in head
    assert {"--nodes=4", "--ntasks=4", "--no-kill", "--kill-on-bad-exit=0"} <= set(workers)
    assert "--kill-on-bad-exit=1" not in workers


def test_squashfs_references_are_paths():
    assert sbatch.squashfs_ref("./img.sqsh") == "./img.sqsh" and sbatch.squashfs_ref("/abs/img.sqsh")
    for bad in ("img.sqsh", "../img.sqsh", "/abs/img.tar", "/a,b.sqsh"):
        with pytest.raises(DeployError, match="absolute or ./-prefixed"):
            sbatch.squashfs_ref(bad)


def test_unsafe_sbatch_directive_is_a_preflight_error():
    job, opts = spec_job("slurm-pyxis")
    bad = job.model_copy(update={"fileroot": "/data/my logs"})
    with pytest.raises(DeployError, match="--output=.*cannot go on an #SBATCH line"):
        render(bad, opts, None)
    with pytest.raises(DeployError, match="--partition"):
        render(job, opts.model_copy(update={"partition": "gpu\n#SBATCH --uid=0"}), None)
    with pytest.raises(DeployError, match="--partition='gpu\\\\n' cannot go on an #SBATCH line"):
        render(job, opts.model_copy(update={"partition": "gpu\n"}), None)  # `$` alone would let it through


def test_set_x_in_env_setup_does_not_trace_the_token(tmp_path):
    """`set -x` in slurm.env_setup traces every command into the job log; the token line is not traced."""
    job, _ = spec_job("slurm")
    script = render(job, SlurmOptions(env_setup=["set -x"]))
    lines = script.splitlines()
    token_at = next(i for i, l in enumerate(lines) if l.startswith("export RAY_AUTH_TOKEN="))
    snippet = "\n".join(["#!/bin/bash", "set -x", *lines[token_at - 1:token_at + 2], 'echo "tok=${#RAY_AUTH_TOKEN}"'])
    (tmp_path / "t.sh").write_text(snippet)
    res = subprocess.run(["bash", str(tmp_path / "t.sh")], capture_output=True, text=True)
    assert "tok=64" in res.stdout
    assert "od -An" not in res.stderr and "RAY_AUTH_TOKEN=" not in res.stderr, res.stderr
    assert "+ echo" in res.stderr  # tracing is back on after the token


HOSTILE = ["; touch {c}", "$(touch {c})", "`touch {c}`", "' ; touch {c}; '", "\"$(touch {c})\"", "x\ntouch {c}",
           ": {{ a: *b }} & | > {c}", "\\\"; touch {c} #"]

FAKE = """#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
if name == "scontrol":
    print("n1\\nn2\\nn3"); sys.exit(0)
if "hostname" in sys.argv:
    print("10.9.8.7"); sys.exit(0)
keys = json.loads(os.environ["RECORD_KEYS"])
with open(os.environ["RECORD_TO"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}) + "\\n")
"""


@pytest.mark.parametrize("pyxis", [True, False])
def test_hostile_values_reach_srun_verbatim_and_run_nothing(pyxis, tmp_path):
    canary = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    values = [h.format(c=canary) for h in HOSTILE]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("srun", "scontrol"):
        (bindir / tool).write_text(FAKE)
        (bindir / tool).chmod(stat.S_IRWXU)
    env = {f"V{i}": v for i, v in enumerate(values)}
    mount_src = f"/data/$(touch {canary})"
    job = jobs.job(name="hostile", nodes=2, command=["python", "-c", *values], env=env,
                   mounts=[{"source": mount_src, "target": "/mnt/`touch x`"}], fileroot=str(tmp_path / "root"),
                   workdir=str(tmp_path))
    script = render(job, SlurmOptions(), PYXIS_IMAGE if pyxis else None)
    bash_n(script, tmp_path)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    record = tmp_path / "record.jsonl"
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[1-3]",
                              "SLURM_JOB_ID": "42", "RECORD_TO": str(record), "RECORD_KEYS": json.dumps(sorted(env))})
    assert res.returncode == 0, res.stderr
    runs = [json.loads(l) for l in record.read_text().splitlines()]  # both steps run in the background: any order
    head, workers = sorted(runs, key=lambda r: "--" not in r["argv"])
    assert head["argv"][head["argv"].index("--") + 1:] == ["python", "-c", *values]
    assert head["env"] == env and workers["env"] == env
    if pyxis:
        assert f"--container-mounts={mount_src}:/mnt/`touch x`" in head["argv"]
    assert not canary.exists() and not (tmp_path / "x").exists()


def test_hostile_job_name_is_rejected():
    with pytest.raises(ValueError, match="name"):
        jobs.job(name="a; rm -rf /")

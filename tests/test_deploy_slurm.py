"""The plain sbatch script, submitted to a real Slurm (three slurmd on this host), runs the example job."""
import json
import os
import re
import sys
from pathlib import Path

import pytest

from deploy.targets.slurm import sbatch
from helpers import jobs
from conftest import make_settings
from toolchain import pipeline
from toolchain.progress import Reporter

pytestmark = pytest.mark.cluster  # starts real Ray nodes and a real Slurm

ROOT = Path(__file__).resolve().parent.parent
VENV_ACTIVATE = Path(sys.executable).parent / "activate"


@pytest.fixture(scope="module")
def cluster(slurm):
    return slurm


def submit(cluster, tmp_path, name, command, nodes=3, port_base=24000, **job_kw):
    fileroot = tmp_path / "fileroot"
    job = jobs.job(None, name=name, nodes=nodes, cpus_per_node=2, command=command, fileroot=str(fileroot),
                   workdir=str(ROOT / "examples" / "train"), port_base=port_base, time_limit="10:00", **job_kw)
    script = tmp_path / f"{name}.sbatch"
    script.write_text(sbatch.render(job, env_setup=[f"source {VENV_ACTIVATE}"], port_stride=200))
    job_id = sbatch.submit(script, job, env=cluster.env)
    fields = cluster.wait(job_id, timeout_s=420)
    output = (fileroot / "logs" / f"{name}-{job_id}.out")
    return fields, output.read_text() if output.exists() else "", job_id


def test_plain_sbatch_trains_across_three_slurm_nodes(cluster, tmp_path, monkeypatch):
    """`invoke deploy --target slurm --submit` with a spec in the seed's own format (no slurm section:
    no partition, account or env_setup): the job runs from the environment sbatch exports."""
    fileroot = tmp_path / "fileroot"
    spec = tmp_path / "seed.json"
    spec.write_text(json.dumps({
        "cluster_type": "slurm", "cluster_name": "seed", "fileroot": str(fileroot), "cpu_image": "raytrain-cpu",
        "gpu_image": "raytrain-gpu", "node_type_from_node_name": {"n\\d$": "cpu"}, "node_name_prefix": "n"}))
    settings = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    settings = settings.model_copy(update={"deploy": settings.deploy.model_copy(update={
        "command": ["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "20", "--fileroot", str(fileroot)],
        "port_base": 24000, "time_limit": "10:00"})})
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    res = pipeline.deploy(settings, str(spec), "slurm", rep=Reporter(quiet=True), nodes=3, name="slurm-e2e",
                          out=str(tmp_path / "out"), submit=True, port_stride=200, env=cluster.env)
    job_id = res.applied.slurm_job_id
    fields = cluster.wait(job_id, timeout_s=420)
    out_file = fileroot / "logs" / f"slurm-e2e-{job_id}.out"
    out = out_file.read_text() if out_file.exists() else ""
    assert fields["JobState"] == "COMPLETED", out[-4000:] + cluster.logs()
    assert fields["ExitCode"] == "0:0"
    assert fields["NodeList"] == "n[1-3]"
    summary = json.loads(next(l for l in out.splitlines() if "SUMMARY " in l).split("SUMMARY ", 1)[1])
    assert summary["nodes"] == 3 and summary["ranks_reported"] == [0, 1, 2]
    assert summary["final_loss"] < summary["first_loss"] / 10
    assert "identity from slurm: node 2 of 3" in out  # the workers' step counts after the head
    assert (tmp_path / "fileroot" / "checkpoints" / "slurm-e2e").is_dir()


def test_failing_driver_fails_the_slurm_job(cluster, tmp_path):
    fields, out, _ = submit(cluster, tmp_path, "slurm-fail", ["python", "-c", "import sys; sys.exit(7)"],
                            nodes=2, port_base=25000)
    # on any failure: the whole job log (each step's code is on its own line) and Slurm's record
    why = f"{fields}\n--- job output ---\n{out}\n--- slurm ---\n{cluster.logs()}"
    assert fields["JobState"] == "FAILED", why
    assert fields["ExitCode"] == "7:0", why
    assert "raytrain: head exited with 7" in out, why
    assert "raytrain: workers step exited with 7" in out, why  # the worker read the published code


def test_a_node_set_down_mid_run_requeues_the_job_which_resumes_its_run(cluster, tmp_path):
    """The default node-failure policy (#SBATCH --requeue): `scontrol update state=down` on a worker's node
    mid-run; Slurm requeues the job, the same script keeps its run id, and training resumes from the
    checkpoint instead of starting over. (`--spare-nodes`, which avoids the requeue, was measured by hand;
    docs/deploying.md has both figures.)"""
    import subprocess
    import time
    name = "slurm-nodefail"
    fileroot = tmp_path / "fileroot"
    job = jobs.job(None, name=name, nodes=3, cpus_per_node=2, fileroot=str(fileroot),
                   command=["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "60", "--step-delay", "0.2",
                            "--ckpt-every", "5", "--fileroot", str(fileroot)],
                   workdir=str(ROOT / "examples" / "train"), port_base=26000, time_limit="15:00",
                   env={"RAYTRAIN_RUN_ID": "nodefail-run"})
    script = tmp_path / f"{name}.sbatch"
    script.write_text(sbatch.render(job, env_setup=[f"source {VENV_ACTIVATE}"], port_stride=200))
    job_id = sbatch.submit(script, job, env=cluster.env)
    log = fileroot / "logs" / f"{name}-{job_id}.out"
    deadline = time.monotonic() + 300
    while ") step 12 loss " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, (log.read_text() if log.exists() else "") + cluster.logs()
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=raytrain-test"], env=cluster.env,
                   check=True)
    fields = cluster.wait(job_id, timeout_s=600)
    out = log.read_text()
    why = f"{fields}\n--- job output ---\n{out[-5000:]}\n--- slurm ---\n{cluster.logs()}"
    assert fields["JobState"] == "COMPLETED" and fields.get("Restarts") == "1", why
    assert "raytrain: job " in out and " restart 1" in out, why
    assert re.search(r"resumed from checkpoint at step 1[0-5]", out), why
    final = json.loads([l for l in out.splitlines() if "SUMMARY " in l][-1].split("SUMMARY ", 1)[1])
    assert final["steps"] == 60 and 45 <= final["trained_steps"] <= 50, why  # resumed, not restarted from 0

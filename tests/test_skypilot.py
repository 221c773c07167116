"""The SkyPilot target: the rendered task is accepted by SkyPilot's own loader, and its `run:`
section, run in three containers of the pushed image with the variables SkyPilot sets, forms the
job and prints its SUMMARY."""
import json
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.job import DeployError
from deploy.targets import skypilot
from helpers import jobs, sky_nodes
from runtime import contract as C
from runtime.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
sky = pytest.importorskip("sky")  # a dev dependency: `pip install -e .[dev]`


def render(job, spec_name="kubernetes.json", **flags):
    spec = load_spec(ROOT / "cluster_specs" / spec_name)
    opts = skypilot.TARGET.parse_options(flags)
    assert skypilot.TARGET.preflight(job, spec, opts) == []
    return skypilot.TARGET.render(job, spec, opts)


def test_task_is_accepted_by_skypilots_loader_and_a_typo_is_refused(tmp_path):
    job = jobs.job(name="sky", nodes=3, gpus_per_node=1, workdir="/opt/app/project", memory="64G",
                   env={"NCCL_DEBUG": "WARN"})
    art = render(job, accelerator="A100", fileroot_store="s3://bucket/runs")
    (name, f), = art.files.items()
    path = tmp_path / name
    path.write_text(f.text)
    task = sky.Task.from_yaml(str(path))
    assert task.num_nodes == 3 and task.envs["NCCL_DEBUG"] == "WARN"
    (res,) = task.resources
    assert res.extract_docker_image() == jobs.DIGEST and res.accelerators == {"A100": 1}
    assert "RAY_AUTH_TOKEN: null" in f.text  # a secret passed at launch, never a value in the file
    assert yaml.safe_load(f.text)["file_mounts"] == {job.fileroot: {"source": "s3://bucket/runs", "mode": "MOUNT"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(f.text.replace("num_nodes:", "num_nodez:"))
    with pytest.raises(Exception, match="num_nodez"):
        sky.Task.from_yaml(str(bad))


def test_seeds_fan_out_as_separate_tasks():
    art = render(jobs.job(name="sweep", nodes=2), seeds="1-3")
    assert sorted(art.files) == ["sweep-s1.yaml", "sweep-s2.yaml", "sweep-s3.yaml"]
    runs = [yaml.safe_load(f.text) for f in art.files.values()]
    assert [r["envs"]["RAYTRAIN_SEED"] for r in runs] == ["1", "2", "3"]
    assert all("--seed" in r["run"] for r in runs)


def test_gpus_without_an_accelerator_name_is_a_preflight_problem():
    spec = load_spec(ROOT / "cluster_specs" / "local.json")  # no GPU types
    problems = skypilot.TARGET.preflight(jobs.job(gpus_per_node=2), spec, skypilot.SkyFlags())
    assert any("--accelerator" in p for p in problems)
    with pytest.raises(DeployError, match="--partition: not an option of the skypilot target"):
        skypilot.TARGET.parse_options({"partition": "x"})


def test_hostile_values_stay_data(tmp_path):
    hostile = ["$(touch /tmp/pwned)", "a'b\"c", "x\ny", "; rm -rf /", "*", "&anchor"]
    job = jobs.job(name="hostile", env={f"V{i}": v for i, v in enumerate(hostile)}, command=["python", "-c", *hostile])
    art = render(job)
    (f,) = art.files.values()
    task = yaml.safe_load(f.text)
    assert task == art.objects[0]
    script = tmp_path / "run.sh"
    script.write_text(task["run"])
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_run_section_forms_the_job_in_three_containers(client, pushed, tmp_path):
    """What SkyPilot does on each node: the task's envs and secrets in the environment, its own
    SKYPILOT_* variables, then `run:` through bash in the task's image."""
    image = pushed["cpu"]["repo_digest"]
    job = jobs.job(image, name="sky-e2e", nodes=3, cpus_per_node=2, workdir=C.PROJECT_DIR,
                   command=["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "10", "--fileroot", "/tmp/j"])
    spec = load_spec(ROOT / "cluster_specs" / "local.json")
    opts = skypilot.TARGET.parse_options({"allow_local_registry": True})
    task = yaml.safe_load(next(iter(skypilot.TARGET.render(job, spec, opts).files.values())).text)
    assert task["resources"]["image_id"] == f"docker:{image}"
    containers, _, network = sky_nodes.start(client, task, f"sky-e2e-{secrets.token_hex(3)}")
    try:
        head = containers[0]
        assert head.wait(timeout=300)["StatusCode"] == 0, head.logs().decode(errors="replace")[-3000:]
        logs = head.logs().decode(errors="replace")
        summary = json.loads(next(l for l in logs.splitlines() if l.startswith("SUMMARY ")).split(" ", 1)[1])
        assert summary["nodes"] == 3 and summary["ranks_reported"] == [0, 1, 2]
        assert "identity from skypilot: node 0 of 3" in logs
    finally:
        sky_nodes.remove(containers, network)

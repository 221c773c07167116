"""The SkyPilot target: the rendered task is accepted by SkyPilot's own loader, and its `run:`
section, run in three containers of the pushed image with the variables SkyPilot sets, forms the
job and prints its SUMMARY."""
import functools
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.job import DeployError
from deploy.targets.base import ApplyContext
from deploy.targets import skypilot
from helpers import jobs, sky_nodes

sky_job = functools.partial(jobs.job, profile="skypilot")  # the image profile the target asks for
from runtime import contract as C
from runtime.spec import load_spec
from toolchain import pipeline
from toolchain.config import ProjectSettings, Settings
from toolchain.progress import Reporter
from toolchain.records import add_launches, read_launches

ROOT = Path(__file__).resolve().parent.parent
sky = pytest.importorskip("sky")  # a dev dependency: `pip install -e .[dev]`


def render(job, spec_name="kubernetes.json", **flags):
    spec = load_spec(ROOT / "cluster_specs" / spec_name)
    opts = skypilot.TARGET.parse_options(flags)
    assert skypilot.TARGET.preflight(job, spec, opts) == []
    return skypilot.TARGET.render(job, spec, opts)


def test_task_is_accepted_by_skypilots_loader_and_a_typo_is_refused(tmp_path):
    job = sky_job(name="sky", nodes=3, gpus_per_node=1, workdir="/opt/app/project", memory="64G",
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
    art = render(sky_job(name="sweep", nodes=2), seeds="1-3")
    assert sorted(art.files) == ["sweep-s1.yaml", "sweep-s2.yaml", "sweep-s3.yaml"]
    runs = [yaml.safe_load(f.text) for f in art.files.values()]
    assert [r["envs"]["RAYTRAIN_SEED"] for r in runs] == ["1", "2", "3"]
    assert all("--seed" in r["run"] for r in runs)


def test_gpus_without_an_accelerator_name_is_a_preflight_problem():
    spec = load_spec(ROOT / "cluster_specs" / "local.json")  # no GPU types
    problems = skypilot.TARGET.preflight(sky_job(gpus_per_node=2), spec, skypilot.SkyFlags())
    assert any("--accelerator" in p for p in problems)
    with pytest.raises(DeployError, match="--partition: not an option of the skypilot target"):
        skypilot.TARGET.parse_options({"partition": "x"})


def test_hostile_values_stay_data(tmp_path):
    hostile = ["$(touch /tmp/pwned)", "a'b\"c", "x\ny", "; rm -rf /", "*", "&anchor"]
    job = sky_job(name="hostile", env={f"V{i}": v for i, v in enumerate(hostile)}, command=["python", "-c", *hostile])
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
    job = sky_job(image, name="sky-e2e", nodes=3, cpus_per_node=2, workdir=C.PROJECT_DIR,
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


def test_memory_per_node_defaults_from_the_cpus_and_skypilots_loader_takes_it(tmp_path):
    art = render(sky_job(name="mem", cpus_per_node=3))
    (f,) = art.files.values()
    (tmp_path / "t.yaml").write_text(f.text)
    (res,) = sky.Task.from_yaml(str(tmp_path / "t.yaml")).resources
    assert res.memory == f"{3 * skypilot.GB_PER_CPU}+"  # not SkyPilot's 1 GB a pod on Kubernetes
    assert any("memory per node: 12 GB" in n for n in art.notes)
    (g,) = render(sky_job(name="mem", memory="1536M")).files.values()
    assert yaml.safe_load(g.text)["resources"]["memory"] == "2+"  # rounded up to whole GB


def test_an_image_without_the_skypilot_profile_is_refused_with_the_build_that_makes_it():
    spec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    problems = skypilot.TARGET.preflight(jobs.job(name="plain"), spec, skypilot.SkyFlags())
    assert len(problems) == 1 and "no SkyPilot profile" in problems[0] and "--profile skypilot" in problems[0]
    assert skypilot.TARGET.preflight(sky_job(name="plain"), spec, skypilot.SkyFlags()) == []


STAND_IN = """#!/bin/sh
# a stand-in `sky`: logs its argv (one JSON list a line), says what SkyPilot says, fails launches on demand
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$SKY_LOG"
case "$1" in
  launch) [ -n "$SKY_FAIL_LAUNCH" ] && { echo "sky.exceptions.ResourcesUnavailableError: pod setup failed"; exit 1; }
          echo "Job submitted, ID: 1" ;;
  down) echo "Terminating cluster(s)... done" ;;
esac
"""


def _stand_in(tmp_path, monkeypatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sky").write_text(STAND_IN)
    (bindir / "sky").chmod(0o755)
    log = tmp_path / "sky.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("SKY_LOG", str(log))
    return log


def _settings(build_dir: Path) -> Settings:
    return Settings(root=ROOT, project=ProjectSettings(build_dir=str(build_dir), spec="cluster_specs/kubernetes.json"))


def _launched_and_destroyed(tmp_path, monkeypatch, seeds: str, fail: bool):
    log = _stand_in(tmp_path, monkeypatch)
    if fail:
        monkeypatch.setenv("SKY_FAIL_LAUNCH", "1")
    build_dir = tmp_path / "build"
    spec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    job = sky_job(name="sweep", nodes=2)
    opts = skypilot.TARGET.parse_options({"seeds": seeds, "submit": True})
    ctx = ApplyContext(out_dir=tmp_path / "out", engine=lambda: None, progress=lambda s: None, env=dict(os.environ),
                       launching=lambda names: add_launches(build_dir, "skypilot", "sweep", names))
    art = skypilot.TARGET.render(job, spec, opts)
    error = None
    try:
        skypilot.TARGET.apply(art, job, spec, opts, ctx)
    except DeployError as e:
        error = str(e)
    launched = read_launches(build_dir, "skypilot", "sweep")
    out = pipeline.destroy(_settings(build_dir), None, "skypilot", "sweep", rep=Reporter(quiet=True))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return error, launched, out, calls, read_launches(build_dir, "skypilot", "sweep")


def test_submit_records_each_cluster_before_launching_it_and_destroy_downs_exactly_those(tmp_path, monkeypatch):
    error, launched, out, calls, left = _launched_and_destroyed(tmp_path, monkeypatch, "1-2", fail=False)
    assert error is None and launched == ["sweep-s1", "sweep-s2"]
    launches = [c for c in calls if c[0] == "launch"]
    assert len(launches) == 2 and all("--down" in c for c in launches)  # SkyPilot removes each when its job ends
    assert calls[-1] == ["down", "-y", "sweep-s1", "sweep-s2"] and out["removed"] == ["sweep-s1", "sweep-s2"]
    assert left == []
    with pytest.raises(DeployError, match="no launched clusters are recorded"):
        pipeline.destroy(_settings(tmp_path / "build"), None, "skypilot", "sweep", rep=Reporter(quiet=True))


def test_a_failed_launch_says_how_to_remove_what_it_left_and_destroy_removes_it(tmp_path, monkeypatch):
    error, launched, out, calls, left = _launched_and_destroyed(tmp_path, monkeypatch, "1-2", fail=True)
    assert error is not None and "sky down -y sweep-s1" in error and "destroy --target skypilot --name sweep" in error
    assert launched == ["sweep-s1"]  # recorded before the launch that failed; the second never started
    assert calls[-1] == ["down", "-y", "sweep-s1"] and left == []


def test_a_held_cluster_of_a_profile_image_takes_code_from_a_tree_built_without_the_flag(tmp_path):
    """`build --profile skypilot` then `run`: the profile's layers are above the app's, so the guard that
    refuses a change below the code must not count the profile (seen on a real SkyPilot cluster)."""
    from toolchain.image.images import source_keys
    plain = _settings(tmp_path / "build")
    profiled = plain.model_copy(update={"image": plain.image.model_copy(update={"profile": "skypilot"})})
    assert source_keys(plain) == source_keys(profiled)
    other = plain.model_copy(update={"image": plain.image.model_copy(update={"python": "python3.12"})})
    assert source_keys(other)["below_app_key"] != source_keys(plain)["below_app_key"]


def test_destroy_from_the_command_line_says_what_it_removed(tmp_path, monkeypatch):
    """The task prints what the target's destroy returned (it printed k8s's kubectl output for every target,
    and failed with KeyError on a real SkyPilot)."""
    log = _stand_in(tmp_path, monkeypatch)
    build_dir = tmp_path / "build"
    add_launches(build_dir, "skypilot", "cli-job", ["cli-job"])
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "raytrain"), "destroy", "--target", "skypilot", "--name", "cli-job"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "INVOKE_PROJECT_BUILD_DIR": str(build_dir)})
    assert r.returncode == 0, r.stderr
    assert "removed SkyPilot cluster(s) cli-job" in r.stderr and "Traceback" not in r.stderr
    assert json.loads(log.read_text().splitlines()[-1]) == ["down", "-y", "cli-job"]
    assert read_launches(build_dir, "skypilot", "cli-job") == []

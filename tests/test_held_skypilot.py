"""Held clusters on SkyPilot (deploy/targets/skypilot/held.py). No SkyPilot cluster runs in CI (one ran by hand,
through SkyPilot's Kubernetes backend: README), so each half is checked against what is real here:

- the tasks (up's, run's, stop's) are accepted by SkyPilot's own loader, and every `sky` command
  line parses with SkyPilot's own CLI (its click commands, without running them);
- the tasks' `run:` sections run in containers of the pushed image the way SkyPilot runs them on a
  docker-image cluster (the task's envs and SKYPILOT_* variables, `bash -c` in SkyPilot's working
  directory without the image's PYTHONPATH, the run task in the synced workdir, the run and stop
  steps in the head's own container): the nodes serve, an edited line shows in the first step on
  every rank, and the stop step ends every node with 0.
"""
import functools
import io
import json
import secrets
import shutil
import tarfile
from pathlib import Path

import click
import pytest
import yaml

from deploy import held_step
from deploy.handles import SkyHandle
from deploy.targets.skypilot import held as sky_held
from deploy.targets.skypilot.task import dump
from deploy.targets import skypilot
from helpers import jobs, sky_nodes

sky_job = functools.partial(jobs.job, profile="skypilot")  # the image profile the target asks for
from runtime import contract as C
from runtime.contract import SERVING_LINE
from runtime.spec import load_spec
from runtime.wait import wait_until
from toolchain.hashing import tree_hash
from toolchain.held import CODE_DIR, code_archive

ROOT = Path(__file__).resolve().parent.parent
sky = pytest.importorskip("sky")  # a dev dependency: `pip install -e .[dev]`
OLD_PRINT = 'print(f"step {self.step} loss {value:.5f} at {time.time() - self.started_at:.2f}s", flush=True)'
NEW_PRINT = 'print(f"step {self.step} loss {value:.5f} CHANGED-ON-SKY", flush=True)'
HANDLE = SkyHandle(cluster="held-sky", job_id="1", nodes=3, job_name="held-sky")


def up_task(job, spec_name="local.json", **flags) -> dict:
    spec = load_spec(ROOT / "cluster_specs" / spec_name)
    opts = skypilot.TARGET.parse_options(flags)
    assert skypilot.TARGET.preflight(job, spec, opts) == []
    (f,) = skypilot.TARGET.render(job, spec, opts).files.values()
    return yaml.safe_load(f.text)


def load(tmp_path, task: dict, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump(task))
    return sky.Task.from_yaml(str(path))


def test_held_tasks_are_accepted_by_skypilots_loader(tmp_path):
    job = sky_job(name="held-sky", nodes=3, gpus_per_node=2, serve=True)
    up = up_task(job, "kubernetes.json", accelerator="A100")
    assert up["run"].count("--serve") == 2 and "train.py" not in up["run"]  # every node serves; no driver
    task = load(tmp_path, up, "up")
    assert task.num_nodes == 3 and next(iter(task.resources)).accelerators == {"A100": 2}

    workdir = tmp_path / "workdir"
    workdir.mkdir()
    run = sky_held.step_task(HANDLE, "run", held_step.runtime_run("raytrain-code/ab12", ["python", "train.py"]),
                             {"RAYTRAIN_RUN_ID": "r1", "RAYTRAIN_JOB_NAME": "held-sky"}, str(workdir))
    task = load(tmp_path, run, "run")
    (res,) = task.resources
    # the run asks for nothing the held job holds: no accelerators, no image of its own, every node
    assert task.num_nodes == 3 and res.accelerators is None and res.extract_docker_image() is None
    assert task.workdir == str(workdir) and task.envs["RAYTRAIN_RUN_ID"] == "r1"
    # SkyPilot starts tasks without the image's PYTHONPATH: every task gives it back
    assert task.envs["PYTHONPATH"] == up["envs"]["PYTHONPATH"] == C.IMAGE_PYTHONPATH
    assert "--unpack-stdin /tmp" in run["run"] and f"< {sky_held.CODE_TAR}" in run["run"]

    stop = sky_held.step_task(HANDLE, "stop", held_step.runtime_stop(), {"RAYTRAIN_JOB_NAME": "held-sky"})
    task = load(tmp_path, stop, "stop")
    assert task.workdir is None and "runtime stop" in stop["run"] and task.name == "held-sky-stop"


def test_seeds_with_up_are_a_preflight_problem():
    spec = load_spec(ROOT / "cluster_specs" / "local.json")
    opts = skypilot.TARGET.parse_options({"seeds": "1-2"})
    problems = skypilot.TARGET.preflight(sky_job(serve=True), spec, opts)
    assert any("a held cluster (invoke up) is one cluster" in p for p in problems)


@pytest.mark.parametrize("argv, expected", [
    (sky_held.launch_argv("up.yaml", "c1"),
     {"cluster": "c1", "yes": True, "detach_run": True, "entrypoint": ("up.yaml",),
      "secret": (("RAY_AUTH_TOKEN", "from-the-env"),)}),
    (sky_held.exec_argv("run.yaml", "c1"), {"cluster": "c1", "entrypoint": ("run.yaml",), "detach_run": False}),
    (sky_held.status_argv("c1", "7"), {"cluster": "c1", "job_ids": ("7",), "status": True}),
    (sky_held.log_argv("c1", "7"), {"cluster": "c1", "job_ids": ("7",), "follow": False, "tail": sky_held.LOG_TAIL}),
    (sky_held.cancel_argv("c1", "7"), {"cluster": "c1", "jobs": (7,), "yes": True}),
    (sky_held.down_argv("c1"), {"clusters": ("c1",), "yes": True}),
    (sky_held.launch_argv("job.yaml", "c2", down_after=True),
     {"cluster": "c2", "yes": True, "detach_run": True, "down": True, "entrypoint": ("job.yaml",)}),
    (sky_held.down_argv("c1", "c1-s2"), {"clusters": ("c1", "c1-s2"), "yes": True}),
])
def test_sky_command_lines_parse_with_skypilots_own_cli(monkeypatch, argv, expected):
    from sky.client.cli import command
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-env")  # launch passes it in the CLI's environment
    assert argv[0] == "sky"
    cmd = command.cli.get_command(click.Context(command.cli), argv[1])
    params = cmd.make_context(argv[1], argv[2:]).params
    assert {k: params[k] for k in expected} == expected


def test_launch_without_the_token_in_the_environment_is_refused_by_skypilots_cli(monkeypatch):
    """Why launch puts a fresh token into the CLI's environment: `--secret NAME` reads it from there."""
    from sky.client.cli import command
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    cmd = command.cli.get_command(click.Context(command.cli), "launch")
    with pytest.raises(click.UsageError, match="RAY_AUTH_TOKEN is not set"):
        cmd.make_context("launch", sky_held.launch_argv("up.yaml", "c1")[2:])


def test_the_job_id_is_read_from_what_skypilots_launch_prints():
    """`sky launch` ends with SkyPilot's own hint (ux_utils.command_hint_messages), coloured as on a
    terminal; the backend's line comes while it streams. Both name the job the held cluster runs."""
    from sky.utils import ux_utils
    from runtime.cluster.log_relay import ANSI

    def plain(text: str) -> str:
        return ANSI.sub(b"", text.encode()).decode()
    hint = ux_utils.command_hint_messages(ux_utils.CommandHintType.CLUSTER_JOB, 7, "held-sky")
    assert sky_held.job_id_from(plain(hint)) == "7"
    streamed = plain(ux_utils.starting_message("Job submitted, ID: 12"))
    assert sky_held.job_id_from(streamed) == "12"
    assert sky_held.job_id_from(plain(streamed + "\n" + hint)) == "7"  # the last one said
    assert sky_held.job_id_from("Cluster name: held-sky\nJob ID: none\n") is None


def _put(container, path: str, name: str, data: bytes):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    container.exec_run(["mkdir", "-p", path])
    assert container.put_archive(path, buf.getvalue())


def test_held_tasks_run_in_the_image_as_skypilot_runs_them(client, pushed, tmp_path):
    image = pushed["cpu"]["repo_digest"]
    run_id = secrets.token_hex(3)
    name = f"held-sky-{run_id}"
    job = sky_job(image, name=name, nodes=3, cpus_per_node=2, serve=True)
    up = up_task(job, allow_local_registry=True)
    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "train", app, ignore=shutil.ignore_patterns("__pycache__"))
    train = app / "train.py"
    assert OLD_PRINT in train.read_text()
    train.write_text(train.read_text().replace(OLD_PRINT, NEW_PRINT))
    rel_dir = f"{CODE_DIR}/{tree_hash(app)[:16]}"
    handle = SkyHandle(cluster=name, job_id="1", nodes=3, job_name=name)
    containers, names, network = sky_nodes.start(client, up, name)
    try:
        head, worker = containers[0], containers[1]
        wait_until(lambda: SERVING_LINE in head.logs().decode(errors="replace"), timeout_s=300, interval_s=1,
                   what="the held head to serve", logs=lambda: head.logs().decode(errors="replace")[-3000:])

        # run: SkyPilot syncs the workdir (the tar) to every node and runs the task there
        run = sky_held.step_task(handle, "run", held_step.runtime_run(rel_dir, [
            "python", "train.py", "--steps", "3", "--cpus-per-worker", "0.5", "--no-spares", "--fileroot", "/tmp/j"]),
            {"RAYTRAIN_RUN_ID": f"run-{run_id}", "RAYTRAIN_JOB_NAME": name}, str(tmp_path))
        tar = code_archive(app, rel_dir)
        for c in (head, worker):
            _put(c, sky_nodes.WORKDIR, sky_held.CODE_TAR, tar)
        rc, out = worker.exec_run(["bash", "-c", run["run"]], workdir=sky_nodes.WORKDIR,
                                  environment=sky_nodes.sky_env(names, 1, run["envs"]))
        assert rc == 0 and out == b""  # the other nodes have nothing to do
        rc, out = head.exec_run(["bash", "-c", run["run"]], workdir=sky_nodes.WORKDIR,
                                environment=sky_nodes.sky_env(names, 0, run["envs"]))
        text = out.decode(errors="replace")
        assert rc == 0, text[-3000:]
        first = [line for line in text.splitlines() if "step 1 loss" in line and "(rank" in line]
        assert first and all("CHANGED-ON-SKY" in line for line in first), text[-3000:]
        summary = json.loads(next(l for l in text.splitlines() if l.startswith("SUMMARY ")).split(" ", 1)[1])
        assert summary["ranks_reported"] == [0, 1, 2] and summary["trained_steps"] == 3

        # down: the stop task on rank 0; every node leaves with 0
        stop = sky_held.step_task(handle, "stop", held_step.runtime_stop(), {"RAYTRAIN_JOB_NAME": name})
        rc, out = head.exec_run(["bash", "-c", stop["run"]], workdir=sky_nodes.WORKDIR,
                                environment=sky_nodes.sky_env(names, 0, stop["envs"]))
        assert rc == 0, out.decode(errors="replace")
        for c in containers:
            assert c.wait(timeout=120)["StatusCode"] == 0, c.logs().decode(errors="replace")[-3000:]
        logs = head.logs().decode(errors="replace")
        assert not [l for l in logs.splitlines() if "marked dead" in l or "SIGTERM received" in l], logs[-3000:]
    finally:
        sky_nodes.remove(containers, network)

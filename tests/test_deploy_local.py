"""`invoke deploy --target local`: the job runs from the pushed digest as containers, cleans up after."""
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import SPEC
from toolchain import pipeline
from toolchain.config import DeploySettings
from runtime.errors import InputError
from toolchain.errors import ToolchainError
from toolchain.progress import Reporter


def with_deploy(settings, **kw):
    return settings.model_copy(update={"deploy": DeploySettings(**kw)})


def job_containers(client, name):
    return client.containers.list(all=True, filters={"label": f"io.raytrain.job={name}"})


def unique(name: str) -> str:
    """The fileroot (the spec's default_mount) is on the host and outlives a run: a job of the same
    name would resume from the last run's checkpoint, so each test run uses its own name."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def summary_of(logs: str) -> dict:
    return json.loads(next(l for l in logs.splitlines() if "SUMMARY " in l).split("SUMMARY ", 1)[1])


def test_local_job_runs_from_digest_and_cleans_up(client, pushed, settings, capfd):
    name = unique("e2e-local")
    s = with_deploy(settings, name=name, command=["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "20"])
    dry = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=3, dry_run=True)
    assert {c["image"] for c in dry.objects} == {pushed["cpu"]["repo_digest"]}
    assert {tuple(c["binds"]) for c in dry.objects} == {("/tmp/raytrain:/tmp/raytrain:rw",)}  # the default_mount
    out = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=3)
    assert out.applied.exit_code == 0
    logs = capfd.readouterr().out
    summary = summary_of(logs)
    assert summary["nodes"] == 3 and summary["ranks_reported"] == [0, 1, 2] and summary["trained_steps"] == 20
    assert f"[{name}-w2] " in logs and f"[{name}-head] " in logs
    assert "Failed to initialize NumPy" not in logs and "exporter agent" not in logs and "\x1b[" not in logs
    # noise a user would learn to ignore: torch's c10d hostname warning, gloo's connection lines, an abort
    assert "[c10d]" not in logs and "[Gloo]" not in logs and "Fatal Python error" not in logs, logs[-3000:]
    # the output a person follows: no Ray INFO line, no "[repeated Nx]" folding, step lines in seconds since
    # the driver started (no epoch stamp), each step once per rank, every rank's last step before SUMMARY
    assert " INFO " not in logs and "[repeated" not in logs and "raytrain-output-mark" not in logs, logs[-3000:]
    lines = logs.splitlines()
    steps = [(i, re.search(r"\(rank(\d)@[^)]*\) step (\d+) loss [\d.]+ at (\d+\.\d\d)s$", line))
             for i, line in enumerate(lines)]
    steps = [(i, m) for i, m in steps if m]
    assert sorted((int(m.group(1)), int(m.group(2))) for _, m in steps) == [(r, k) for r in range(3)
                                                                           for k in range(1, 21)], logs[-3000:]
    assert all(float(m.group(3)) < 600 for _, m in steps) and "[driver] step" not in logs
    assert max(i for i, _ in steps) < next(i for i, line in enumerate(lines) if "SUMMARY " in line), logs[-3000:]
    assert job_containers(client, name) == []
    assert not [n for n in client.networks.list() if n.name.startswith(f"{name}-")]
    # the checkpoint went to the host's fileroot, through the spec's default_mount, under this run's id
    first = out.job["env"]["RAYTRAIN_RUN_ID"]
    assert first.startswith(f"{name}-") and (Path("/tmp/raytrain/checkpoints") / name / first / "ckpt.pt").is_file()
    try:
        # the same command again is a new run: it trains, from step 0
        again = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=2)
        second = again.job["env"]["RAYTRAIN_RUN_ID"]
        run2 = summary_of(capfd.readouterr().out)
        assert second != first and run2["trained_steps"] == 20 and run2["first_loss"] is not None
        # --resume continues the last run: at step 20 of 20 there is nothing to train, and it says so
        resumed = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=2, resume=True)
        assert resumed.job["env"]["RAYTRAIN_RUN_ID"] == second
        captured = capfd.readouterr()
        assert summary_of(captured.out)["trained_steps"] == 0
        assert f"NOTHING TRAINED: run {second} is already at step 20 of 20" in captured.out + captured.err
    finally:
        shutil.rmtree(Path("/tmp/raytrain/checkpoints") / name, ignore_errors=True)


def test_resume_without_an_earlier_run_is_refused(pushed, settings, tmp_path):
    s = settings.model_copy(update={"deploy": DeploySettings(name=unique("never")),
                                    "project": settings.project.model_copy(update={"build_dir": str(tmp_path)})})
    (tmp_path / "images.json").write_text((settings.build_dir / "images.json").read_text())
    with pytest.raises(InputError, match="--resume: no earlier run of --name 'never-.*' in .*runs.json; deploy without --resume"):
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), resume=True)
    assert not (tmp_path / "runs.json").exists()


def test_failing_driver_fails_the_deploy(client, pushed, settings):
    name = unique("e2e-fail")
    s = with_deploy(settings, name=name, nodes=2, command=["python", "-c", "import sys; sys.exit(9)"])
    with pytest.raises(ToolchainError, match="exited with 9"):
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter())
    assert job_containers(client, name) == []


def test_dry_run_starts_nothing_and_hides_token(client, pushed, settings):
    s = with_deploy(settings, name="e2e-dry")
    out = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), dry_run=True)
    assert len(out.objects) == 3 and out.applied is None
    assert {c["environment"]["RAY_AUTH_TOKEN"] for c in out.objects} == {"<generated per run>"}
    assert job_containers(client, "e2e-dry") == []


def test_preflight_rejects_bad_job_name(pushed, settings):
    s = with_deploy(settings, name="Bad Name;rm")
    with pytest.raises(InputError, match="name"):
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), dry_run=True)


def test_a_worker_that_fails_first_is_named_with_its_lines_and_the_fix(client, built):
    """The local target's watch on real containers: a worker that fails while the head still runs gives
    the head WORKER_GRACE_S, then the head is stopped (no job waits out a barrier); the diagnosis names
    the worker that failed first, not one that only lost the head, with its last lines and the fix."""
    import time

    from deploy.targets import local
    image = built["cpu"]["local_ref"]
    failing = ("echo '[launch node1/3 w1] ray start (worker) failed (attempt 1, after 36.2s): ray start exited with 1: "
               "Exception: The current node timed out during startup.'; sleep 2; exit 2")
    head = client.containers.run(image, ["sleep", "300"], detach=True)
    lost = client.containers.run(image, ["sh", "-c", "sleep 5; echo the head is gone; exit 3"], detach=True)
    worker = client.containers.run(image, ["sh", "-c", failing], detach=True)
    try:
        t0 = time.monotonic()
        code, stopped = local._watch(head, [lost, worker], timeout_s=120)
        took = time.monotonic() - t0
        assert code != 0 and stopped and local.WORKER_GRACE_S <= took < local.WORKER_GRACE_S + 20, (code, took)
        text = local.diagnose(head, "job-head", [lost, worker], ["job-w1", "job-w2"], cores=2, nodes=3)
    finally:
        for c in (head, lost, worker):
            c.remove(force=True)
    assert text.startswith("node job-w2 failed first (exit 2); its last lines:"), text
    assert "The current node timed out during startup" in text
    assert "fix: this machine could not start every node's Ray in time (3 nodes on 2 core(s)" in text
    assert "job-w1" not in text  # it only lost the head (exit 3)


def test_a_failing_driver_is_named_not_the_workers_that_left_after_it(client, pushed, settings):
    """The driver raises on the head; the workers then leave with its code: the job's failure names the
    driver on the head, with its last lines, not a worker."""
    from toolchain.errors import ToolchainError
    name = unique("driverfail")
    s = with_deploy(settings, name=name, command=["python", "-c", "raise SystemExit('the driver gives up: 7')"])
    with pytest.raises(ToolchainError) as e:
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter(quiet=True), nodes=3)
    text = str(e.value)
    assert f"the driver on the head ({name}-head) failed first (exit 1)" in text, text
    assert "the driver gives up: 7" in text and f"{name}-w" not in text.split("its last lines")[0], text


def curve(run_dir: Path, who: str, tag: str) -> list:
    """The scalars TAG of one writer of a run, read by TensorBoard's own reader (every event file of the
    directory, as `tensorboard --logdir` shows them): [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / who))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_every_run_leaves_tensorboard_curves_and_a_resumed_run_continues_them(client, pushed, settings, capfd):
    """The README's local job writes event files per rank under <fileroot>/runs/<job>/<run id>, and the
    deploy says where; a resumed run writes its steps on the same curve."""
    name = unique("curves")
    command = ["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "10", "--ckpt-every", "5"]
    s = with_deploy(settings, name=name, command=command)
    try:
        out = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=2)
        assert out.applied.exit_code == 0
        run_dir = Path("/tmp/raytrain/runs") / name / out.job["env"]["RAYTRAIN_RUN_ID"]
        captured = capfd.readouterr()
        assert f"curves: {run_dir} (tensorboard --logdir {run_dir})" in captured.out  # said once: the same path here
        assert summary_of(captured.out)["devices"] == ["cpu/gloo"]
        for rank in ("rank0", "rank1"):
            assert [step for step, _ in curve(run_dir, rank, "loss")] == list(range(1, 11))
            times = curve(run_dir, rank, "step_time_s")
            assert [step for step, _ in times] == list(range(1, 11)) and all(0 < t < 60 for _, t in times)
            assert all(v > 0 for _, v in curve(run_dir, rank, "samples_per_s"))
        assert [step for step, _ in curve(run_dir, "driver", "startup/ray_init_s")] == [0]
        # --resume with more steps: the same directory, steps 11..15 after 1..10, one curve
        s = with_deploy(settings, name=name, command=[*command[:-3], "15", "--ckpt-every", "5"])
        resumed = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=2, resume=True)
        assert resumed.applied.exit_code == 0 and summary_of(capfd.readouterr().out)["trained_steps"] == 5
        for rank in ("rank0", "rank1"):
            assert [step for step, _ in curve(run_dir, rank, "loss")] == list(range(1, 16))
        assert [step for step, _ in curve(run_dir, "driver", "startup/ray_init_s")] == [0, 10]
    finally:
        shutil.rmtree(Path("/tmp/raytrain/checkpoints") / name, ignore_errors=True)
        shutil.rmtree(Path("/tmp/raytrain/runs") / name, ignore_errors=True)

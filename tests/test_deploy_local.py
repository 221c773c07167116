"""`invoke deploy --target local`: the job runs from the pushed digest as containers, cleans up after."""
import json
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


def test_local_job_runs_from_digest_and_cleans_up(client, pushed, settings, capfd):
    name = unique("e2e-local")
    s = with_deploy(settings, name=name, command=["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "20"])
    dry = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=3, dry_run=True)
    assert {c["image"] for c in dry["objects"]} == {pushed["cpu"]["repo_digest"]}
    assert {tuple(c["binds"]) for c in dry["objects"]} == {("/tmp/raytrain",)}  # the spec's default_mount
    out = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), nodes=3)
    assert out["exit_code"] == 0
    logs = capfd.readouterr().out
    summary = json.loads(next(l for l in logs.splitlines() if "SUMMARY " in l).split("SUMMARY ", 1)[1])
    assert summary["nodes"] == 3 and summary["ranks_reported"] == [0, 1, 2]
    assert f"[{name}-w2] " in logs and f"[{name}-head] " in logs
    assert job_containers(client, name) == []
    assert not [n for n in client.networks.list() if n.name.startswith(f"{name}-")]
    # the checkpoint went to the host's fileroot, through the spec's default_mount
    assert (Path("/tmp/raytrain/checkpoints") / name / "ckpt.pt").is_file()
    shutil.rmtree(Path("/tmp/raytrain/checkpoints") / name, ignore_errors=True)


def test_failing_driver_fails_the_deploy(client, pushed, settings):
    name = unique("e2e-fail")
    s = with_deploy(settings, name=name, nodes=2, command=["python", "-c", "import sys; sys.exit(9)"])
    with pytest.raises(ToolchainError, match="exited with 9"):
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter())
    assert job_containers(client, name) == []


def test_dry_run_starts_nothing_and_hides_token(client, pushed, settings):
    s = with_deploy(settings, name="e2e-dry")
    out = pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), dry_run=True)
    assert len(out["objects"]) == 3 and "exit_code" not in out
    assert {c["environment"]["RAY_AUTH_TOKEN"] for c in out["objects"]} == {"<generated per run>"}
    assert job_containers(client, "e2e-dry") == []


def test_preflight_rejects_bad_job_name(pushed, settings):
    s = with_deploy(settings, name="Bad Name;rm")
    with pytest.raises(InputError, match="name"):
        pipeline.deploy(s, str(SPEC), "local", rep=Reporter(), dry_run=True)

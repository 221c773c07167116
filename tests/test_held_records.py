"""build/clusters.json as a careless user or an attacker leaves it: every value of a held cluster's
record reaches a scheduler tool as an argument, so each is checked when read (deploy/handles.py).
Through the real `invoke status/down` with the tools on PATH replaced by ones that log their argv: a
bad record is one line and exit 2 naming the field, and no tool ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]
TOOLS = ("scancel", "squeue", "srun", "sbatch", "sky", "kubectl")
SHA = "0" * 64


def record(name: str, target: str, handle: dict) -> dict:
    return {"name": name, "target": target, "image": f"127.0.0.1:5000/raytrain-cpu@sha256:{SHA}", "variant": "cpu", "spec_sha256": SHA, "below_app_key": "k",
            "runtime_sha256": "r", "project": str(ROOT), "started": "2026-11-29T08:00:00Z", "handle": handle}


SLURM = {"job_id": "42", "head_node": "n1", "log": "/tmp/raytrain/logs/job-42.out", "job_name": "job"}
SKY = {"cluster": "job", "job_id": "1", "nodes": 2, "job_name": "job"}
K8S = {"namespace": "default", "job_name": "job", "head_pod": "job-head-0"}

BAD = {
    "a job id that is an option": ("slurm", {**SLURM, "job_id": "--user=root"}, "handle.job_id"),
    "a node name that is an option": ("slurm", {**SLURM, "head_node": "-w"}, "handle.head_node"),
    "a job name with a list separator": ("pyxis", {**SLURM, "job_name": "job,LD_PRELOAD=/x.so"}, "handle.job_name"),
    "a Pyxis container that is not ours": ("pyxis", {**SLURM, "container": "other"}, "handle.container"),
    "a SkyPilot cluster that is an option": ("skypilot", {**SKY, "cluster": "-a"}, "handle.cluster"),
    "a SkyPilot job id that is a word": ("skypilot", {**SKY, "job_id": "all"}, "handle.job_id"),
    "a node count that is a string": ("skypilot", {**SKY, "nodes": "2"}, "handle.nodes"),
    "a namespace that is an option": ("k8s", {**K8S, "namespace": "--all-namespaces"}, "handle.namespace"),
    "a missing job id": ("slurm", {k: v for k, v in SLURM.items() if k != "job_id"}, "handle.job_id"),
    "an empty handle": ("slurm", {}, "handle."),
    "an unknown field": ("slurm", {**SLURM, "extra": "x"}, "handle.extra"),
    "a list where a name belongs": ("k8s", {**K8S, "head_pod": ["a"]}, "handle.head_pod"),
    "the host network": ("local", {"network": "host", "head": "job-head-1", "containers": ["job-head-1", "/etc"],
                                   "aliases": []}, "handle"),
    "a target that holds nothing": ("plain", {}, "holds no clusters"),
    "another job's network": ("local", {"network": "bridge", "head": "job-head-1", "containers": ["job-head-1"],
                                        "aliases": []}, "handle"),
    "another job's container": ("local", {"network": "job-net", "head": "job-head-1",
                                          "containers": ["job-head-1", "registry"], "aliases": []}, "handle"),
}


@pytest.fixture
def tools(tmp_path):
    """The scheduler tools, replaced by ones that log their argv and fail."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    return bin_dir, log


def write_clusters(tmp_path, records: dict) -> Path:
    build = tmp_path / "build"
    build.mkdir()
    (build / "clusters.json").write_text(json.dumps(records))
    return build / "clusters.json"


def invoke(tmp_path, tools, *args):
    bin_dir, _ = tools
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "build")}
    return subprocess.run(INVOKE + list(args), cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_record_is_refused_naming_its_field_and_no_tool_runs(tmp_path, tools, case):
    target, handle, field = BAD[case]
    clusters = write_clusters(tmp_path, {"job": record("job", target, handle)})
    before = clusters.read_bytes()
    for command in (["status"], ["down", "--name", "job"], ["run", "--name", "job"]):
        r = invoke(tmp_path, tools, *command)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert field in r.stderr and "clusters.json" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not tools[1].exists(), tools[1].read_text()  # no scheduler tool was run
    assert clusters.read_bytes() == before


@pytest.mark.parametrize("field,value", [("image", "\x1b[2J\x1b[31mpwned"), ("image", "raytrain-cpu:latest"),
                                         ("started", "now\nfake line"), ("started", "\x1b]0;title\x07")])
def test_what_status_prints_is_checked_when_read(tmp_path, tools, field, value):
    """`status` prints a record's image and start time: a value that is not a pinned image or a timestamp
    (escape sequences, a line break) is refused with one line naming the field, and nothing is printed raw."""
    write_clusters(tmp_path, {"job": {**record("job", "slurm", SLURM), field: value}})
    r = invoke(tmp_path, tools, "status")
    assert r.returncode == 2 and field in r.stderr and "clusters.json" in r.stderr, r.stderr
    assert "\x1b" not in r.stdout and "fake line" not in r.stdout


@pytest.mark.parametrize("what", ["directory", "fifo", "dangling link"])
def test_a_records_file_that_is_not_a_regular_file_is_named(tmp_path, tools, what):
    build = tmp_path / "build"
    build.mkdir()
    clusters = build / "clusters.json"
    if what == "directory":
        clusters.mkdir()
    elif what == "fifo":
        os.mkfifo(clusters)
    else:
        clusters.symlink_to(tmp_path / "missing")
    r = invoke(tmp_path, tools, "status")
    assert r.returncode == 2 and ("clusters.json is not a regular file" in r.stderr
                                  or "clusters.json cannot be opened as a file (a link)" in r.stderr), r.stderr


def test_a_record_filed_under_another_name_is_refused(tmp_path, tools):
    write_clusters(tmp_path, {"job": record("other", "slurm", SLURM)})
    r = invoke(tmp_path, tools, "status")
    assert r.returncode == 2 and "is named 'other'" in r.stderr, r.stderr


def test_a_good_record_reaches_the_tool_as_one_argument(tmp_path, tools):
    """The check lets a well-formed record through: status asks squeue about exactly its job."""
    write_clusters(tmp_path, {"job": record("job", "slurm", SLURM)})
    invoke(tmp_path, tools, "status")
    calls = tools[1].read_text().splitlines()
    assert calls and all(c.startswith("squeue") for c in calls) and any(" 42" in c for c in calls), calls


def test_local_down_removes_only_what_carries_the_clusters_label(tmp_path, tools, client, built):
    """A local record naming another job's container and the `host` network: `invoke down` removes
    neither (it removes only containers and networks labelled as this held cluster's)."""
    import uuid
    name = f"bystander-{uuid.uuid4().hex[:6]}"
    other = client.containers.run(built["cpu"]["local_ref"], ["sleep", "300"], name=name, detach=True,
                                  labels={"io.raytrain.job": "someone-else"})
    try:
        write_clusters(tmp_path, {"job": record("job", "local", {
            "network": "host", "head": name, "containers": [name], "aliases": ["job-head"]})})
        r = invoke(tmp_path, tools, "down", "--name", "job")
        other.reload()
        assert other.status == "running", (r.stdout, r.stderr)
        assert client.networks.list(names=["host"]), "the host network is gone"
    finally:
        other.remove(force=True)


def test_status_asks_slurm_once_for_every_held_job(tmp_path, tools):
    """400 held Slurm clusters: one squeue call for all (one call each took over 60 s), each cluster's
    state read from its own line."""
    bin_dir, log = tools
    (bin_dir / "squeue").write_text(
        f'#!/bin/sh\necho "squeue $*" >> {log}\n'
        'for id in $(echo "$3" | tr , " "); do [ $((id % 2)) -eq 0 ] && echo "$id RUNNING"; done; exit 0\n')
    records = {f"job{i}": record(f"job{i}", "slurm", {**SLURM, "job_id": str(1000 + i)}) for i in range(400)}
    write_clusters(tmp_path, records)
    r = invoke(tmp_path, tools, "status", "--json")
    assert r.returncode == 1, r.stderr  # half of them are not up
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("squeue -h -j 1000,1001,"), calls[:3]
    out = json.loads(r.stdout)
    assert [out[f"job{i}"]["up"] for i in range(4)] == [True, False, True, False]
    assert out["job3"]["nodes"] == {"job 1003 (head n1)": "gone"}


def test_a_held_run_that_fails_leaves_runs_json_as_it_was(tmp_path, tools):
    """`invoke run` on a held Slurm cluster whose srun step exits 5: exit 1 naming the run, and
    build/runs.json byte for byte as before (a failed run is not the run `invoke build` reproduces)."""
    from runtime.spec import spec_hash
    from toolchain import project
    from toolchain.image.images import source_keys
    settings = project.settings(ROOT)
    keys = source_keys(settings)
    bin_dir, log = tools
    (bin_dir / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {log}\necho RUNNING\n')
    (bin_dir / "srun").write_text(f'#!/bin/sh\necho "srun $*" >> {log}\ncat > /dev/null\nexit 5\n')
    write_clusters(tmp_path, {"job": {**record("job", "slurm", SLURM), "below_app_key": keys["below_app_key"],
                                      "runtime_sha256": keys["runtime_sha256"],
                                      "spec_sha256": spec_hash(settings.path(settings.project.spec))}})
    runs = tmp_path / "build" / "runs.json"
    runs.write_text('{"other": {"run_id": "r-1", "target": "slurm", "started": "2026-11-29T07:00:00Z"}}')
    before = runs.read_bytes()
    r = invoke(tmp_path, tools, "run", "--name", "job")
    assert r.returncode == 1 and "failed with exit code 5" in r.stderr, (r.stdout, r.stderr)
    assert any(c.startswith("srun --jobid=42") for c in log.read_text().splitlines())  # the step did run
    assert runs.read_bytes() == before


def test_every_holding_target_reaches_its_clusters_through_one_typed_seam():
    """A target that holds clusters names its handle model (the one registry: deploy.targets.TARGETS) and
    either a HeldOps module or its own three operations; an unknown target name is refused by name."""
    from deploy.targets import HOLDING, TARGETS, check_handle
    from deploy.targets.base import HeldOps, Target
    from runtime.errors import InputError
    assert HOLDING == [n for n, t in TARGETS.items() if t.handle is not None]
    for name in HOLDING:
        t = TARGETS[name]
        overrides = all(getattr(type(t), op) is not getattr(Target, op) for op in ("held_status", "held_run", "held_down"))
        assert overrides or isinstance(t.held, HeldOps), name
    assert type(check_handle("pyxis", {**SLURM, "container": "raytrain-head-42"}, "test", "job")).__name__ == "SlurmHandle"
    with pytest.raises(InputError, match="target 'nomad' holds no clusters"):
        check_handle("nomad", SLURM, "clusters.json [job]", "job")

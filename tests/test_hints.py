"""Every hint `up`, `run`, `status`, `down` and `deploy` print names the program the user ran
(`raytrain` or `invoke`) and the flags needed to repeat what was done. Through the real CLI, with
the scheduler tools on PATH replaced by scripts, against records in a build directory of the test's
own (its real path is what the hints name)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolchain.held import _up_args

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"raytrain": [str(Path(sys.executable).parent / "raytrain")], "invoke": [sys.executable, "-m", "invoke"]}
SLURM = {"job_id": "42", "head_node": "n1", "log": "/tmp/raytrain/logs/job-42.out", "job_name": "job"}
UP_ARGS = "--nodes 2 --sqsh --allow-local-registry"


def record(target: str, handle: dict, up_args: str = UP_ARGS) -> dict:
    return {"name": "job", "target": target, "image": "127.0.0.1:5000/raytrain-cpu@sha256:" + "0" * 64, "variant": "cpu", "spec_sha256": "0" * 64,
            "below_app_key": "not-this-tree", "runtime_sha256": "r", "project": str(ROOT), "started": "2026-11-29T08:00:00Z",
            "handle": handle, "up_args": up_args}


@pytest.fixture(params=sorted(PROGRAMS))
def cli(request, tmp_path):
    """Runs PROGRAM ARGS with build/ in tmp_path and a squeue that says STATE (RUNNING, or '' for gone)."""
    program = request.param
    if program == "raytrain" and not Path(PROGRAMS["raytrain"][0]).exists():
        pytest.skip("no raytrain console script beside this Python")
    build, bin_dir = tmp_path / "elsewhere" / "build", tmp_path / "bin"
    build.mkdir(parents=True)
    bin_dir.mkdir()

    def run(*args: str, state: str = "", records: dict | None = None) -> subprocess.CompletedProcess:
        (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{state}'\n")
        (bin_dir / "squeue").chmod(0o755)
        if records is not None:
            (build / "clusters.json").write_text(json.dumps(records))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "INVOKE_PROJECT_BUILD_DIR": str(build)}
        return subprocess.run(PROGRAMS[program] + list(args), cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=120)
    run.program, run.build = program, build
    return run


def test_the_flags_up_was_given_are_kept_as_typed():
    assert _up_args(None, 2, {"sqsh": True, "allow_local_registry": True, "port_stride": 200, "partition": None,
                              "exclusive": False}) == ["--nodes", "2", "--sqsh", "--allow-local-registry",
                                                        "--port-stride", "200"]
    assert _up_args("specs/my spec.json", None, {}) == ["--spec", "specs/my spec.json"]


@pytest.mark.parametrize("up_args", [["--spec", "specs/my spec; rm x.json"], "--spec 'specs/my spec; rm x.json'"])
def test_a_recorded_value_comes_back_quoted_in_the_hint(cli, up_args):
    """The record's words (or an older record's shell-quoted string) are checked when read, then each is
    quoted for a shell where a hint repeats them."""
    r = cli("run", "--name", "job", state="", records={"job": record("pyxis", SLURM, up_args)})
    assert f"`{cli.program} up --target pyxis --name job --spec 'specs/my spec; rm x.json'`" in r.stderr, r.stderr


@pytest.mark.parametrize("up_args,says", [
    ("--nodes 2; touch /tmp/x", "touch"),                    # a command after a flag's value
    (["--nodes", "2\nerror: fake line"], "control character"),
    (["--nodes", "\x1b[2J"], "control character"),
    (["rm", "-rf"], "'rm' is neither a flag"),
    ("--spec 'unclosed", "not shell words"),
])
def test_a_recorded_up_that_is_not_flags_is_refused_when_read(cli, up_args, says):
    r = cli("run", "--name", "job", state="", records={"job": record("pyxis", SLURM, up_args)})
    assert r.returncode == 2 and "up_args" in r.stderr and says in r.stderr, r.stderr
    assert "touch /tmp/x`" not in r.stderr and "\x1b" not in r.stderr and "\nerror: fake" not in r.stderr


def test_status_without_clusters_names_up(cli):
    r = cli("status")
    assert r.returncode == 0 and f"no held clusters (`{cli.program} up` starts one)" in r.stdout, r.stdout + r.stderr


def test_run_and_down_without_a_cluster_name_up_and_the_real_records_file(cli):
    for command in (["run", "--name", "job"], ["down", "--name", "job"]):
        r = cli(*command)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert f"`{cli.program} up --target local --name job`" in r.stderr, r.stderr
        assert str(cli.build / "clusters.json") in r.stderr, r.stderr


def test_up_again_names_status_and_down_with_the_name(cli):
    r = cli("up", "--target", "pyxis", "--name", "job", records={"job": record("pyxis", SLURM)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"`{cli.program} status --name job`" in r.stderr and f"`{cli.program} down --name job`" in r.stderr, r.stderr


def test_run_on_a_cluster_that_is_gone_repeats_up_with_its_flags(cli):
    r = cli("run", "--name", "job", state="", records={"job": record("pyxis", SLURM)})
    assert r.returncode != 0, r.stdout + r.stderr
    assert (f"`{cli.program} down --name job` clears its record, then "
            f"`{cli.program} up --target pyxis --name job {UP_ARGS}`") in r.stderr, r.stderr


def test_run_refused_by_the_guard_redeploys_with_the_same_flags(cli):
    r = cli("run", "--name", "job", state="RUNNING", records={"job": record("pyxis", SLURM)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"`{cli.program} run` cannot send this code to 'job'" in r.stderr, r.stderr
    assert (f"rebuild and redeploy: {cli.program} build push && {cli.program} down --name job && "
            f"{cli.program} up --target pyxis --name job {UP_ARGS}") in r.stderr, r.stderr


def test_deploy_without_a_pushed_image_names_build_push(cli):
    r = cli("deploy", "--target", "local", "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"run `{cli.program} build push` first" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_tool_in_the_toolchains_own_venv_runs_without_the_venv_on_path(tmp_path, monkeypatch):
    """`sky` from the `skypilot` extra lives in .venv/bin: a user who runs .venv/bin/raytrain without
    activating the venv still reaches it (it was `sky is not on PATH`); a tool on PATH wins."""
    from deploy import commands
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "sky").write_text("#!/bin/sh\necho venv-sky \"$@\"\n")
    (venv_bin / "sky").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    env = {"PATH": "/usr/bin:/bin"}
    assert commands.run(["sky", "status"], "install it", env).stdout.strip() == "venv-sky status"
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "sky").write_text("#!/bin/sh\necho path-sky\n")
    (on_path / "sky").chmod(0o755)
    assert commands.run(["sky"], "install it", {"PATH": f"{on_path}:/usr/bin"}).stdout.strip() == "path-sky"
    from deploy.job import DeployError
    with pytest.raises(DeployError, match="kubectl-missing is not on PATH"):
        commands.run(["kubectl-missing"], "install it", env)

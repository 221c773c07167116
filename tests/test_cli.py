"""The Invoke CLI: every task documented, bad specs exit 2 and change nothing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]


def inv(*args, env=None, cwd=ROOT):
    return subprocess.run(INVOKE + list(args), cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_list_shows_every_task_with_help():
    out = inv("--list").stdout
    for name in ("build", "push", "spec.check", "spec.schema", "base.bootstrap", "registry.start", "registry.stop"):
        line = next((l for l in out.splitlines() if l.strip().startswith(name + " ")), "")
        assert len(line.split()) > 2, f"{name} has no one-line help: {line!r}"


@pytest.mark.parametrize("task_name,flag", [("build", "--variant"), ("push", "--spec"), ("build", "--quiet"), ("push", "--json")])
def test_task_help_documents_flags(task_name, flag):
    out = inv(task_name, "--help").stdout
    line = next(l for l in out.splitlines() if flag in l)
    assert len(line.split()) > 3, line


def test_spec_check_prints_resolution():
    r = inv("spec.check", "cluster_specs/slurm-pyxis.json", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["node_types"] == {"slurmd-\\d+$": "g8"} and out["slurm"]["partition"] == "gpu"


def test_bad_spec_build_exits_2_and_touches_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cluster_type": "slurm", "cluster_name": "x", "fileroot": "/x",
                               "cpu_image": "a", "gpu_image": "b", "node_type_from_node_name": {"(": "a"},
                               "node_type_from_nodename": {}}))
    build_dir = tmp_path / "build"
    r = inv("build", "--spec", str(bad), env={"INVOKE_PROJECT_BUILD_DIR": str(build_dir)})
    assert r.returncode == 2, r.stderr
    assert "node_type_from_node_name" in r.stderr and "did you mean 'node_type_from_node_name'" in r.stderr
    assert not build_dir.exists()


def test_env_override_reaches_config(tmp_path):
    r = inv("push", "--variant", "tpu", env={"INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "b")})
    assert r.returncode == 2 and "'tpu' is not one of the configured variants" in r.stderr

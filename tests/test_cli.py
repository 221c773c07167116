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
    for name in ("build", "push", "deploy", "destroy", "up", "run", "status", "down", "spec.check", "spec.schema",
                 "base.bootstrap", "base.publish", "registry.start", "registry.stop", "registry.ping"):
        line = next((l for l in out.splitlines() if l.strip().startswith(name + " ")), "")
        assert len(line.split()) > 2, f"{name} has no one-line help: {line!r}"
    names = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    leaves = [n.rpartition(".")[2] for n in names]
    assert len(set(leaves)) == len(leaves), f"two tasks share a name: {names}"  # `status` is the held clusters'


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


@pytest.mark.parametrize("env,needle", [
    ({"INVOKE_DEPLOY_NODES": "abc"}, "INVOKE_DEPLOY_NODES: 'abc' is not a whole number"),
    ({"INVOKE_DEPLOY_COMMAND": "python x.py"}, "INVOKE_DEPLOY_COMMAND: command is a list"),
    ({"INVOKE_DEPLOY_PORT_BASE": "x"}, "INVOKE_DEPLOY_PORT_BASE"),
    ({"INVOKE_DEPLOY_CPUS_PER_NODE": "5000"}, "4096"),  # deploy.job.MAX_CPUS_PER_NODE, the settings' bound too
    ({"INVOKE_DEPLOY": '{"nodes": 2}'}, "INVOKE_DEPLOY: deploy is a group of settings, not one value"),  # was ignored
    ({"INVOKE_IMAGE_TORCH": "x"}, "INVOKE_IMAGE_TORCH: torch is a group of settings"),
])
def test_uncastable_invoke_variables_exit_2_without_a_traceback(env, needle):
    r = inv("deploy", "--dry-run", env=env)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "abc"], "--nodes: 'abc' is not a whole number"),
    (["--nodes", "0"], "--nodes: '0' is not a whole number between 1 and 10000"),
    (["--nodes", "10001"], "--nodes: '10001' is not a whole number between 1 and 10000"),  # deploy.job.MAX_NODES
    (["--port-stride", "x"], "--port-stride"),
    (["--target", "k8s", "--spec", "cluster_specs/kubernetes.json", "--port-stride", "10"], "not an option of the k8s"),
])
def test_bad_deploy_flags_exit_2_without_a_traceback(args, needle, tmp_path):
    r = inv("deploy", "--dry-run", *args, env={"INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "b")})
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_out_naming_an_existing_file_exits_2(tmp_path):
    f = tmp_path / "file"
    f.write_text("keep")
    b = tmp_path / "b"
    b.mkdir()
    spec = ROOT / "cluster_specs" / "slurm.json"
    from runtime.spec import spec_hash
    (b / "images.json").write_text(json.dumps({}))
    r = inv("deploy", "--target", "slurm", "--spec", str(spec), "--out", str(f), env={"INVOKE_PROJECT_BUILD_DIR": str(b)})
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr, r.stderr
    assert f.read_text() == "keep" and spec_hash(spec)


def test_deploy_says_once_what_it_wrote(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    (b / "images.json").write_text(json.dumps({}))  # plain Slurm runs the nodes' own environment: no image
    r = inv("deploy", "--target", "slurm", "--spec", str(ROOT / "cluster_specs" / "slurm.json"),
            "--out", str(tmp_path / "out"), env={"INVOKE_PROJECT_BUILD_DIR": str(b)})
    assert r.returncode == 0, r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if "wrote " in line]
    assert len(said) == 1 and said[0].strip().endswith(".sbatch"), r.stdout + r.stderr


def test_a_dry_run_shows_its_artifacts_though_pre_flight_refuses_and_exits_2(tmp_path):
    """The user sees what would be written beside every problem (here: the image carries another spec)."""
    from test_deploy_targets import record_images
    from conftest import make_settings
    settings = make_settings(tmp_path / "p", ROOT / "examples" / "train")
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    record_images(settings, "slurm.json")  # built with slurm.json, deployed with slurm-pyxis.json
    r = inv("deploy", "--dry-run", "--target", "pyxis", "--spec", str(ROOT / "cluster_specs" / "slurm-pyxis.json"),
            "--name", "dry", env={"INVOKE_PROJECT_BUILD_DIR": str(settings.build_dir)})
    assert r.returncode == 2, r.stderr
    assert "# ---- dry.sbatch (dry run: not written)" in r.stdout and "#SBATCH" in r.stdout, r.stdout
    assert "pre-flight failed" in r.stderr and "was built with spec sha256" in r.stderr, r.stderr
    assert not (settings.build_dir / "deploy").exists()


def test_malformed_images_json_exits_2_with_the_fix(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    (b / "images.json").write_text('{"cpu": {"repo_digest": "x\\nrm -rf /"}}')
    r = inv("deploy", "--dry-run", env={"INVOKE_PROJECT_BUILD_DIR": str(b)})
    assert r.returncode == 2 and "images.json is malformed" in r.stderr and "invoke push" in r.stderr, r.stderr


LIGHT = """
import sys
sys.modules.update(ray=None, torch=None, numpy=None)   # any import of them now fails
sys.path[:0] = [{root!r}, {tests!r}]
import tasks                                            # every task's module
from toolchain import pipeline
from toolchain.image import images, bootstrap
from toolchain.publish import push, local_registry
from toolchain.wheels import wheelhouse
from deploy.targets import TARGETS
from conftest import make_settings
from test_deploy_targets import record_images, SPECS
from toolchain.progress import Reporter
settings = make_settings(__import__("pathlib").Path({tmp!r}) / "p", __import__("pathlib").Path({root!r}) / "examples" / "train")
for spec, target in [("slurm-pyxis.json", "pyxis"), ("slurm.json", "slurm"), ("kubernetes.json", "k8s"),
                     ("kubernetes.json", "skypilot"), ("local.json", "local")]:
    record_images(settings, spec, profile="skypilot" if target == "skypilot" else "default")
    pipeline.deploy(settings, str(SPECS / spec), target, rep=Reporter(quiet=True), dry_run=True)
print("light ok", sorted(TARGETS))
"""


def test_build_push_and_deploy_need_neither_torch_nor_ray(tmp_path):
    """`scripts/setup.sh --light` installs the toolchain without torch, ray or numpy: every task module
    imports and every target renders with those imports made to fail."""
    import subprocess
    import sys
    code = LIGHT.format(root=str(ROOT), tests=str(ROOT / "tests"), tmp=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "light ok" in res.stdout, res.stderr[-3000:]


def test_sigterm_ends_a_task_through_its_finally(tmp_path):
    """A task sent SIGTERM (a CI cancel, `kill`) unwinds as Ctrl-C does: its `finally` runs (where a local
    job removes its containers and network), and it exits 143. Without the boundary's handler Python
    ends the process on the spot."""
    import signal
    script = (f"import sys, time\nsys.path.insert(0, {str(ROOT)!r})\n"
              "from toolchain.boundary import sigterm_unwinds\n"
              "with sigterm_unwinds():\n"
              "    try:\n"
              "        print('ready', flush=True)\n"
              "        time.sleep(60)\n"
              "    finally:\n"
              f"        open({str(tmp_path / 'cleaned')!r}, 'w').close()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert (tmp_path / "cleaned").exists()


def test_destroy_is_each_targets_own(tmp_path):
    """`invoke destroy` asks the target: the local target has nothing to delete (exit 2, saying which
    target does), k8s checks the name before kubectl runs."""
    env = {"INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "b")}
    r = inv("destroy", env=env)
    assert r.returncode == 2 and "--target local: nothing to destroy" in r.stderr, r.stderr
    r = inv("destroy", "--target", "k8s", "--spec", "cluster_specs/kubernetes.json", "--name", "Bad_Name", env=env)
    assert r.returncode == 2 and "not a job name" in r.stderr, r.stderr
    r = inv("destroy", "--target", "mainframe", env=env)
    assert r.returncode == 2 and "is not one of" in r.stderr, r.stderr


def test_bare_raytrain_and_help_list_the_tasks_first():
    """A user who types `raytrain` or `raytrain --help` sees the tasks, not only Invoke's core options."""
    import subprocess
    for argv in ([], ["--help"]):
        res = subprocess.run([str(ROOT / ".venv" / "bin" / "raytrain"), *argv], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        head = res.stdout.split("Core options")[0]
        for task in ("build", "push", "deploy", "up", "run", "status", "down"):
            assert f"\n  {task} " in head, (argv, res.stdout[:500])


def test_every_task_s_help_is_its_usage_whatever_its_arguments():
    """`raytrain TASK --help` (and -h) prints the task's usage for every task listed, one with a positional
    argument (spec.check FILE) included, and exits 0."""
    raytrain = str(ROOT / ".venv" / "bin" / "raytrain")
    listing = subprocess.run([raytrain, "--list"], capture_output=True, text=True, timeout=120).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert "spec.check" in names and len(names) > 10, listing
    for name in names:
        for flag in ("--help", "-h"):
            res = subprocess.run([raytrain, name, flag], capture_output=True, text=True, timeout=120)
            assert res.returncode == 0 and f"raytrain [--core-opts] {name} " in res.stdout, (name, flag, res)


def test_help_into_a_pipe_whose_reader_left_says_nothing():
    """`raytrain --help | head -1`: the reader leaves, and raytrain ends as a Unix tool does (141), without an
    error line about the pipe. The pipe's read end is closed before raytrain writes, so every write fails."""
    for argv in (["--help"], ["deploy", "--help"]):
        r, w = os.pipe()
        os.close(r)
        try:
            res = subprocess.run([str(ROOT / ".venv" / "bin" / "raytrain"), *argv], stdout=w, stderr=subprocess.PIPE,
                                 text=True, timeout=120)
        finally:
            os.close(w)
        assert res.returncode == 141 and res.stderr == "", res

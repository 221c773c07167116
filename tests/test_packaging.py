"""The toolchain as a user installs it: the built wheel (not an editable install) in a fresh venv,
run in a project of the user's outside this repository: `raytrain init`, then `build push deploy
--target local` on the real engine and registry, to the job's SUMMARY."""
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import ROOT, SESSION

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_every_package_of_the_tree_is_in_the_wheel_s_list():
    from setuptools import find_packages
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set(find_packages(str(ROOT), include=["toolchain*", "runtime*", "deploy*"]))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the files git has (as `pip install git+...` would), in a copy: setuptools'
    build/ and egg-info stay out of this checkout."""
    import shutil
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=600)
    (made,) = out.glob("raytrain_toolchain-*.whl")
    return made


def test_the_wheel_carries_the_tasks_templates_specs_runtime_requirements_and_example(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("toolchain/tasks.py", "toolchain/assets/dockerfiles/skypilot.Dockerfile.j2",
                   "toolchain/assets/cluster_specs/local.json", "toolchain/assets/cluster_specs/schema.json",
                   "toolchain/assets/example/train.py", "toolchain/assets/example/requirements.txt",
                   "runtime/requirements.txt", "runtime/cluster/launch.py", "deploy/targets/k8s/__init__.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "examples/")) or n == "tasks.py"]


USER_DRIVER = textwrap.dedent('''\
    """A Ray driver of the user's: counts the cluster's nodes and uses packages the runtime lacks."""
    import json

    import hydra
    import ray
    import tabulate

    ray.init()
    nodes = [n for n in ray.nodes() if n["Alive"]]
    print("SUMMARY " + json.dumps({"nodes": len(nodes), "table": tabulate.tabulate([["ok", len(nodes)]]),
                                   "hydra": hydra.__version__}))
    ''')


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its dependencies from the index; its `raytrain`."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return venv / "bin" / "raytrain"


def test_the_installed_tool_runs_a_user_s_project_end_to_end(installed, client, registry, settings, built,
                                                           tmp_path):
    user = tmp_path / f"{SESSION}-userproj"  # its images are the session's: removed with them (tests/conftest.py)
    user.mkdir()
    assert ROOT not in user.parents
    (user / "train.py").write_text(USER_DRIVER)
    # hydra-core, unpinned as users list it: its 1.3 releases need antlr4-python3-runtime 4.9.3, an sdist only
    (user / "requirements.txt").write_text("tabulate==0.9.0\nhydra-core\n")
    env = {**os.environ, "INVOKE_REGISTRY_ADDRESS": settings.registry.address,
           "INVOKE_IMAGE_REPOSITORY": SESSION}  # the session's stage names (hermetic: tests/conftest.py)

    def raytrain(*args, timeout=1800):
        return subprocess.run([str(installed), *args], cwd=user, capture_output=True, text=True, env=env,
                              timeout=timeout)
    init = raytrain("init")
    assert init.returncode == 0, init.stderr
    assert "wrote raytrain.yaml" in init.stdout and (user / "cluster_specs" / "local.json").is_file()
    spec = json.loads((user / "cluster_specs" / "local.json").read_text())
    assert spec["cpu_image"] == f"{SESSION}-userproj-cpu"

    run = raytrain("build", "--variant", "cpu", "push", "deploy", "--target", "local", "--nodes", "2")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    summary = json.loads(re.search(r"SUMMARY (\{.*\})", out).group(1))
    assert summary["nodes"] == 2 and "ok" in summary["table"]
    assert Version(summary["hydra"]) >= Version("1.3"), summary  # the newest, not pip's wheels-only 0.11
    assert f"job {SESSION}-userproj finished with exit code 0" in out
    # its stages are named as the session's (INVOKE_IMAGE_REPOSITORY), which the engine holds (`built`, also when
    # this test runs alone): built there, as a machine that builds and runs here does, with no line about where
    # (toolchain/image/way.py)
    assert "build[cpu]: in the engine" not in out and "build[cpu]: without the engine" not in out
    pushed = json.loads((user / "build" / "images.json").read_text())["cpu"]
    assert pushed["repo_digest"].startswith(f"{settings.registry.address}/{SESSION}-userproj-cpu@sha256:")
    assert f"{SESSION}-userproj-cpu:cpu-latest" in client.images.get(pushed["local_ref"]).tags
    # the image's code is the user's project, and the runtime is the one installed with the tool
    ls = lambda d: set(client.containers.run(pushed["local_ref"], ["ls", d], remove=True).decode().split())
    assert {"train.py", "requirements.txt", "raytrain.yaml", "cluster_specs"} <= ls("/app/project")
    assert {"cluster", "workers", "requirements.txt", "__main__.py"} <= ls("/app/runtime")

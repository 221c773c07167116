"""A spec in the seed's own format (no registry, slurm or kubernetes sections) builds, pushes and
deploys to slurm and pyxis; deploying the image with another spec, or from a loopback registry,
is refused with the fix (exit 2 through the CLI)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SESSION, make_settings
from runtime.imageref import ImageRef
from toolchain import pipeline
from toolchain.progress import Reporter

SEED = {
    "cluster_type": "slurm", "cluster_name": "seed-cluster", "fileroot": "/storage/exp",
    "default_mount": "/storage:/storage", "node_type_from_node_name": {"slurmd-\\d+$": "g8"},
    "gpu_type_from_node_name": {"slurmd-\\d+$": "tesla"}, "cpu_image": f"{SESSION}-cpu",
    "gpu_image": f"{SESSION}-gpu", "node_name_prefix": "slurmd-"}


@pytest.fixture(scope="module")
def seed_project(tmp_path_factory, app_dir, registry, built):
    """Its own build dir (the session's build.json stays as it is); base, deps and app layers are reused."""
    work = tmp_path_factory.mktemp("seed")
    spec = work / "seed.json"
    spec.write_text(json.dumps(SEED, indent=2))
    settings = make_settings(work / "proj", app_dir)
    pipeline.build(settings, str(spec), "cpu", Reporter(quiet=True))
    pushed = pipeline.push(settings, str(spec), "cpu", Reporter(quiet=True))["images"]["cpu"]
    return settings, spec, pushed


def test_seed_spec_builds_pushes_and_deploys(seed_project, tmp_path):
    settings, spec, pushed = seed_project
    assert pushed["user"] == "1000:1000" and pushed["registry_scheme"] == "http"
    res = pipeline.deploy(settings, str(spec), "slurm", rep=Reporter(quiet=True), nodes=3, name="seed",
                          out=str(tmp_path / "s"))
    script = Path(res.applied.written[0]).read_text()
    assert "--partition" not in script and "--account" not in script
    subprocess.run(["bash", "-n", res.applied.written[0]], check=True)
    res = pipeline.deploy(settings, str(spec), "pyxis", rep=Reporter(quiet=True), nodes=3, name="seed",
                          out=str(tmp_path / "p"), partition="debug", allow_local_registry=True, allow_http_registry=True)
    script = Path(res.applied.written[0]).read_text()
    assert "#SBATCH --partition=debug" in script
    assert f"--container-image={ImageRef.parse(pushed['repo_digest']).pyxis()}" in script


def inv(settings, *args, env=None):
    """The real CLI, pointed at the seed project's build dir."""
    e = {**os.environ, "INVOKE_PROJECT_BUILD_DIR": str(settings.build_dir),
         "INVOKE_REGISTRY_ADDRESS": settings.registry.address, **(env or {})}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, env=e,
                          timeout=120)


def test_cli_refuses_another_spec_and_a_loopback_registry_with_exit_2(seed_project, tmp_path):
    settings, spec, pushed = seed_project
    out = tmp_path / "out"
    r = inv(settings, "deploy", "--target", "pyxis", "--spec", "cluster_specs/slurm-pyxis.json", "--gpus", "0",
            "--out", str(out), "--allow-local-registry", "--allow-http-registry")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "built with spec sha256" in r.stderr and "INVOKE_PROJECT_SPEC=cluster_specs/slurm-pyxis.json" in r.stderr
    r = inv(settings, "deploy", "--target", "pyxis", "--spec", str(spec), "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "loopback registry" in r.stderr and "--sqsh" in r.stderr and "ENROOT_ALLOW_HTTP" in r.stderr
    assert not out.exists()

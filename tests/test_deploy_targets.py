"""`invoke deploy` for the artifact targets: pre-flight, dry run, all-or-nothing writes (no engine needed)."""
import json
import stat
from pathlib import Path

import pytest
import yaml

from conftest import make_settings
from toolchain import pipeline
from toolchain.errors import ConfigError
from toolchain.progress import Reporter

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
CPU = "127.0.0.1:5000/raytrain-cpu@sha256:" + "1" * 64
GPU = "127.0.0.1:5000/raytrain-gpu@sha256:" + "2" * 64


@pytest.fixture
def settings(tmp_path):
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    (s.build_dir / "images.json").write_text(json.dumps({"cpu": {"repo_digest": CPU}, "gpu": {"repo_digest": GPU}}))
    return s


def deploy(settings, spec, target, dry_run=False, **kw):
    return pipeline.deploy(settings, str(SPECS / spec), target, None, kw.pop("name", "job1"), dry_run,
                           Reporter(quiet=True), **kw)


@pytest.mark.parametrize("spec,target,fname", [("slurm.json", "slurm", "job1.sbatch"),
                                               ("slurm-pyxis.json", "pyxis", "job1.sbatch"),
                                               ("kubernetes.json", "k8s", "job1.yaml")])
def test_dry_run_renders_and_writes_nothing(settings, tmp_path, spec, target, fname):
    out = tmp_path / "out"
    res = deploy(settings, spec, target, dry_run=True, out=str(out))
    assert list(res["rendered"]) == [fname] and res["rendered"][fname]
    assert not out.exists()
    written = deploy(settings, spec, target, out=str(out))
    assert [Path(w).name for w in written["written"]] == [fname]
    assert (out / fname).read_text() == res["rendered"][fname]
    if fname.endswith(".sbatch"):
        assert (out / fname).stat().st_mode & stat.S_IXUSR
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_pyxis_uses_the_gpu_digest_and_spec_gpu_count(settings):
    res = deploy(settings, "slurm-pyxis.json", "pyxis", dry_run=True)
    assert res["job"]["gpus_per_node"] == 8 and res["job"]["image"] == GPU
    assert "--container-image=127.0.0.1:5000#raytrain-gpu@sha256:" + "2" * 64 in res["rendered"]["job1.sbatch"]


def test_pyxis_sqsh_reference_is_planned_without_converting(settings):
    res = deploy(settings, "slurm-pyxis.json", "pyxis", dry_run=True, sqsh=True, sqsh_to_fileroot=True)
    assert res["sqsh"] == "/storage/ray-experiments/images/raytrain-gpu+sha256-" + "2" * 64 + ".sqsh"
    assert f"--container-image={res['sqsh']}" in res["rendered"]["job1.sbatch"]
    assert not (settings.build_dir / "sqsh").exists()


@pytest.mark.parametrize("spec,target,kw,msg", [
    ("local.json", "pyxis", {}, "slurm.partition: not set"),
    ("local.json", "k8s", {}, "kubernetes.namespace"),
    ("slurm-pyxis.json", "pyxis", {"gpus": 4}, "GPUs per node: the job asks for 4, the spec's slurm.gpus_per_node is 8"),
    ("slurm-pyxis.json", "pyxis", {"seeds": "1-3"}, "fan-out is for the k8s target"),
    ("kubernetes.json", "k8s", {"gpus": 2, "seeds": "1-2", "slots": "n1:0"}, "a GPU slot gives one GPU"),
    ("kubernetes.json", "k8s", {"seeds": "3-1"}, "not a range"),
    ("kubernetes.json", "k8s", {"gpus": 0}, "the job asks for 0, the spec's kubernetes.gpus_per_pod is 1"),
    ("kubernetes.json", "nomad", {}, "not one of local, slurm, pyxis, k8s"),
    ("slurm.json", "slurm", {"name": "Bad_Name"}, "name"),
])
def test_preflight_failures_write_nothing(settings, tmp_path, spec, target, kw, msg):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=msg):
        deploy(settings, spec, target, out=str(out), **kw)
    assert not out.exists()


def test_missing_digest_is_a_preflight_error(settings, tmp_path):
    (settings.build_dir / "images.json").write_text("{}")
    with pytest.raises(ConfigError, match="no pushed gpu image.*invoke build push"):
        deploy(settings, "slurm-pyxis.json", "pyxis", out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_k8s_takes_gpu_count_and_image_from_the_spec(settings):
    res = deploy(settings, "kubernetes.json", "k8s", dry_run=True)
    assert res["job"]["gpus_per_node"] == 1 and res["job"]["image"] == GPU
    pod = list(yaml.safe_load_all(res["rendered"]["job1.yaml"]))[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_k8s_seed_fanout_file(settings, tmp_path):
    res = deploy(settings, "kubernetes.json", "k8s", out=str(tmp_path / "o"), seeds="1-3", slots="gpu-node-1:0,gpu-node-1:1")
    objs = list(yaml.safe_load_all(Path(res["written"][0]).read_text()))
    heads = [o for o in objs if o["kind"] == "Job"]
    assert [o["metadata"]["name"] for o in heads] == [f"job1-s{s}-{r}" for s in (1, 2, 3) for r in ("head", "workers")]
    assert {o["metadata"]["labels"]["raytrain.io/group"] for o in objs} == {"job1"}

"""`invoke deploy` for the artifact targets: pre-flight, dry run, all-or-nothing writes (no engine needed)."""
import json
import re
import stat
from pathlib import Path

import pytest
import yaml

from conftest import make_settings
from runtime.spec import spec_hash
from toolchain import pipeline
from deploy.job import DeployError
from runtime.errors import InputError as ConfigError
from toolchain.progress import Reporter

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
CPU = "registry.example.com:5000/raytrain-cpu@sha256:" + "1" * 64
GPU = "registry.example.com:5000/raytrain-gpu@sha256:" + "2" * 64


def record_images(settings, spec, registry="registry.example.com:5000", scheme="https", user="1000:1000",
                  profile="default"):
    """build/images.json as `invoke push` writes it, for images built with SPEC (and PROFILE)."""
    sha = spec_hash(SPECS / spec)
    (settings.build_dir / "images.json").write_text(json.dumps({
        v: {"repo_digest": d.replace("registry.example.com:5000", registry), "spec_sha256": sha,
            "spec_file": f"cluster_specs/{spec}", "registry": registry, "registry_scheme": scheme, "user": user,
            "local_ref": f"raytrain-{v}:x", "image_id": "sha256:" + "9" * 64, "digest": d.split("@")[1],
            "profile": profile}
        for v, d in (("cpu", CPU), ("gpu", GPU))}))


@pytest.fixture
def settings(tmp_path):
    return make_settings(tmp_path / "proj", ROOT / "examples" / "train")


def deploy(settings, spec, target, dry_run=False, recorded=True, **kw):
    if recorded:
        record_images(settings, spec, profile="skypilot" if target == "skypilot" else "default")
    kw.setdefault("name", "job1")
    return pipeline.deploy(settings, str(SPECS / spec), target, rep=Reporter(quiet=True), dry_run=dry_run, **kw)


@pytest.mark.parametrize("spec,target,fname", [("slurm.json", "slurm", "job1.sbatch"),
                                               ("slurm-pyxis.json", "pyxis", "job1.sbatch"),
                                               ("kubernetes.json", "k8s", "job1.yaml")])
def test_dry_run_renders_and_writes_nothing(settings, tmp_path, spec, target, fname):
    out = tmp_path / "out"
    res = deploy(settings, spec, target, dry_run=True, out=str(out))
    assert list(res.rendered) == [fname] and res.rendered[fname]
    assert not out.exists()
    written = deploy(settings, spec, target, out=str(out))
    assert [Path(w).name for w in written.applied.written] == [fname]
    # what was shown is what was written, but for the run id: each deploy is a new run
    shown_run, written_run = res.job["env"]["RAYTRAIN_RUN_ID"], written.job["env"]["RAYTRAIN_RUN_ID"]
    assert shown_run != written_run
    assert (out / fname).read_text() == res.rendered[fname].replace(shown_run, written_run)
    if fname.endswith(".sbatch"):
        assert (out / fname).stat().st_mode & stat.S_IXUSR
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_pyxis_uses_the_gpu_digest_and_spec_gpu_count(settings):
    res = deploy(settings, "slurm-pyxis.json", "pyxis", dry_run=True)
    assert res.job["gpus_per_node"] == 8 and res.job["image"] == GPU
    assert "--container-image=registry.example.com:5000#raytrain-gpu@sha256:" + "2" * 64 in res.rendered["job1.sbatch"]


def test_pyxis_sqsh_reference_is_planned_without_converting(settings):
    res = deploy(settings, "slurm-pyxis.json", "pyxis", dry_run=True, sqsh=True, sqsh_to_fileroot=True)
    assert res.sqsh == "/storage/ray-experiments/images/raytrain-gpu+sha256-" + "2" * 64 + ".sqsh"
    assert f"--container-image={res.sqsh}" in res.rendered["job1.sbatch"]
    assert not (settings.build_dir / "sqsh").exists()


@pytest.mark.parametrize("spec,target,kw,msg", [
    ("local.json", "k8s", {}, "kubernetes.namespace"),
    ("slurm-pyxis.json", "pyxis", {"gpus": 4}, "the job asks for 4 GPUs per node, the spec's slurm.gpus_per_node is 8"),
    ("slurm-pyxis.json", "pyxis", {"seeds": "1-3"}, "--seeds: not an option of the pyxis target"),
    ("kubernetes.json", "k8s", {"gpus": 2, "seeds": "1-2", "slots": "n1:0"}, "a GPU slot gives one GPU"),
    ("kubernetes.json", "k8s", {"seeds": "3-1"}, "not an increasing range"),
    ("kubernetes.json", "k8s", {"seeds": "1-100000000"}, "more than 1000 runs"),
    ("kubernetes.json", "k8s", {"gpus": 0}, "the job asks for 0 GPUs per node, the spec's kubernetes.gpus_per_pod is 1"),
    ("kubernetes.json", "nomad", {}, "not one of local, slurm, pyxis, k8s, skypilot"),
    ("slurm.json", "slurm", {"name": "Bad_Name"}, "name"),
    ("slurm.json", "slurm", {"name": ""}, "name"),
    ("slurm.json", "slurm", {"name": "1job"}, "name"),
    ("slurm.json", "slurm", {"nodes": 0}, "nodes"),
    ("kubernetes.json", "k8s", {"partition": "gpu"}, "--partition: not an option of the k8s target"),
    ("kubernetes.json", "k8s", {"port_stride": 100}, "--port-stride: not an option of the k8s target"),
    ("slurm-pyxis.json", "pyxis", {"sqsh_to_fileroot": True}, "--sqsh-to-fileroot: only with --sqsh"),
])
def test_preflight_failures_write_nothing(settings, tmp_path, spec, target, kw, msg):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=msg):
        deploy(settings, spec, target, out=str(out), **kw)
    assert not out.exists()


def test_missing_digest_is_a_preflight_error(settings, tmp_path):
    (settings.build_dir / "images.json").write_text("{}")
    with pytest.raises(DeployError, match="no pushed gpu image.*invoke build push"):
        deploy(settings, "slurm-pyxis.json", "pyxis", out=str(tmp_path / "out"), recorded=False)
    assert not (tmp_path / "out").exists()


SEED_SPEC = {  # the seed's own format: no registry, slurm or kubernetes sections
    "cluster_type": "slurm", "cluster_name": "seed-cluster", "fileroot": "/storage/exp",
    "default_mount": "/storage:/storage", "node_type_from_node_name": {"slurmd-\\d+$": "g8"},
    "gpu_type_from_node_name": {"slurmd-\\d+$": "tesla"}, "cpu_image": "raytrain-cpu", "gpu_image": "raytrain-gpu",
    "node_name_prefix": "slurmd-"}


@pytest.mark.parametrize("target", ["slurm", "pyxis"])
def test_a_seed_format_spec_deploys_without_partition_or_account(settings, tmp_path, target):
    spec = tmp_path / "seed.json"
    spec.write_text(json.dumps(SEED_SPEC))
    sha = spec_hash(spec)
    (settings.build_dir / "images.json").write_text(json.dumps({"cpu": {
        "repo_digest": CPU, "spec_sha256": sha, "registry": "registry.example.com:5000", "registry_scheme": "https",
        "local_ref": "raytrain-cpu:x", "image_id": "sha256:" + "9" * 64, "digest": CPU.split("@")[1]}}))
    res = pipeline.deploy(settings, str(spec), target, rep=Reporter(quiet=True), name="job1", out=str(tmp_path / "o"))
    script = (tmp_path / "o" / "job1.sbatch").read_text()
    assert "--partition" not in script and "--account" not in script
    assert any("default" in n for n in res.notes)
    res = pipeline.deploy(settings, str(spec), target, rep=Reporter(quiet=True), name="job1", dry_run=True,
                          partition="debug", account="ml")
    assert "#SBATCH --partition=debug" in res.rendered["job1.sbatch"]
    assert "#SBATCH --account=ml" in res.rendered["job1.sbatch"]


@pytest.mark.parametrize("target", ["pyxis", "k8s", "local"])
def test_a_spec_other_than_the_baked_one_is_refused_with_the_fix(settings, tmp_path, target):
    spec = {"pyxis": "slurm-pyxis.json", "k8s": "kubernetes.json", "local": "local.json"}[target]
    record_images(settings, "slurm.json")  # the images carry another spec
    with pytest.raises(ConfigError) as e:
        deploy(settings, spec, target, out=str(tmp_path / "out"), recorded=False)
    assert "built with spec sha256" in str(e.value) and "cluster_specs/slurm.json" in str(e.value)
    assert f"INVOKE_PROJECT_SPEC=cluster_specs/{spec} invoke build push deploy" in str(e.value)
    assert e.value.exit_code == 2 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["pyxis", "k8s"])
def test_a_loopback_registry_is_refused_unless_allowed(settings, tmp_path, target):
    spec = "slurm-pyxis.json" if target == "pyxis" else "kubernetes.json"
    record_images(settings, spec, registry="127.0.0.1:5000", scheme="https")
    with pytest.raises(ConfigError, match="loopback registry 127.0.0.1:5000, which compute nodes cannot pull"):
        deploy(settings, spec, target, out=str(tmp_path / "out"), recorded=False)
    assert not (tmp_path / "out").exists()
    deploy(settings, spec, target, dry_run=True, recorded=False, allow_local_registry=True)
    if target == "pyxis":  # the image travels as a file: no registry involved
        deploy(settings, spec, target, dry_run=True, recorded=False, sqsh=True)


def test_a_plain_http_registry_needs_the_sites_enroot_setting(settings, tmp_path):
    record_images(settings, "slurm-pyxis.json", scheme="http")
    with pytest.raises(ConfigError, match="speaks plain HTTP.*ENROOT_ALLOW_HTTP=yes"):
        deploy(settings, "slurm-pyxis.json", "pyxis", out=str(tmp_path / "out"), recorded=False)
    res = deploy(settings, "slurm-pyxis.json", "pyxis", dry_run=True, recorded=False, allow_http_registry=True)
    assert res.rendered["job1.sbatch"]


def test_k8s_needs_a_numeric_image_user(settings, tmp_path):
    record_images(settings, "kubernetes.json", user="ray")
    with pytest.raises(ConfigError, match="no numeric USER recorded"):
        deploy(settings, "kubernetes.json", "k8s", out=str(tmp_path / "out"), recorded=False)


def test_k8s_takes_gpu_count_and_image_from_the_spec(settings):
    res = deploy(settings, "kubernetes.json", "k8s", dry_run=True)
    assert res.job["gpus_per_node"] == 1 and res.job["image"] == GPU
    pod = list(yaml.safe_load_all(res.rendered["job1.yaml"]))[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_k8s_seed_fanout_file(settings, tmp_path):
    res = deploy(settings, "kubernetes.json", "k8s", out=str(tmp_path / "o"), seeds="1-3", slots="gpu-node-1:0,gpu-node-1:1")
    objs = list(yaml.safe_load_all(Path(res.applied.written[0]).read_text()))
    heads = [o for o in objs if o["kind"] == "Job"]
    assert [o["metadata"]["name"] for o in heads] == [f"job1-s{s}-{r}" for s in (1, 2, 3) for r in ("head", "workers")]
    assert {o["metadata"]["labels"]["raytrain.io/group"] for o in objs} == {"job1"}


@pytest.mark.parametrize("spec,target", [("local.json", "local"), ("slurm.json", "slurm"),
                                         ("slurm-pyxis.json", "pyxis"), ("kubernetes.json", "k8s"),
                                         ("kubernetes.json", "skypilot")])
def test_command_flag_reaches_every_target(settings, spec, target):
    """--command is split as a shell splits it, once, and each target runs exactly that argv."""
    argv = ["python", "train.py", "--note", "two words; $(not run)", "--steps", "7"]
    res = deploy(settings, spec, target, dry_run=True, command="python train.py --note 'two words; $(not run)' --steps 7")
    assert res.job["command"] == argv
    text = json.dumps(res.objects) + "".join((res.rendered or {}).values())
    assert "two words; $(not run)" in text or "'two words; $(not run)'" in text
    with pytest.raises(ConfigError, match="--command: .* cannot be split as a shell would .*close the quotes"):
        deploy(settings, spec, target, dry_run=True, command="python train.py --note 'unclosed")


@pytest.mark.parametrize("spec,target", [("local.json", "local"), ("slurm.json", "slurm"),
                                         ("slurm-pyxis.json", "pyxis"), ("kubernetes.json", "k8s"),
                                         ("kubernetes.json", "skypilot")])
def test_env_reaches_every_target_over_the_settings(settings, spec, target):
    """deploy.env, then each --env KEY=VALUE over it, in the job every target renders; the value kept as given."""
    s = settings.model_copy(deep=True)
    s.deploy.env = {"NCCL_DEBUG": "WARN", "KEEP": "kept"}
    res = deploy(s, spec, target, dry_run=True, job_env=["NCCL_DEBUG=INFO", "NOTE=two words; $(not run)"])
    assert {k: res.job["env"][k] for k in ("NCCL_DEBUG", "KEEP", "NOTE")} == \
        {"NCCL_DEBUG": "INFO", "KEEP": "kept", "NOTE": "two words; $(not run)"}
    text = json.dumps(res.objects) + "".join((res.rendered or {}).values())
    assert "NCCL_DEBUG" in text and "INFO" in text and "KEEP" in text


@pytest.mark.parametrize("given,says", [
    (["NOEQUALS"], "--env: 'NOEQUALS' is not KEY=VALUE"),
    (["1BAD=x"], "--env: '1BAD' is not an environment variable name"),
    (["RAYTRAIN_RUN_ID=mine"], "--env: RAYTRAIN_RUN_ID is the runtime's own variable"),
    (["A=x\x00y"], "--env: the value of A contains NUL"),
])
def test_bad_env_is_one_error_naming_the_flag(settings, given, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        deploy(settings, "slurm.json", "slurm", dry_run=True, job_env=given)


@pytest.mark.parametrize("spec,target", [("slurm-pyxis.json", "pyxis"), ("kubernetes.json", "skypilot")])
def test_submit_asks_the_registry_first_and_writes_nothing(settings, tmp_path, spec, target):
    """At --submit the nodes will pull: a registry that does not answer is named before anything is
    submitted or written (without --submit the files are written: nodes may reach what this host cannot)."""
    record_images(settings, spec, registry="127.0.0.1:1", profile="skypilot" if target == "skypilot" else "default")
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="registry 127.0.0.1:1 is unreachable from here"):
        deploy(settings, spec, target, recorded=False, out=str(out), submit=True, allow_local_registry=True)
    assert not out.exists()
    written = deploy(settings, spec, target, recorded=False, out=str(out), allow_local_registry=True)
    assert written.applied.written


def test_a_deploy_whose_submission_fails_keeps_the_last_run_for_resume(settings, tmp_path):
    """sbatch refused (here: not on PATH): nothing ran, so `--resume` must still continue the run before."""
    from toolchain.errors import ToolchainError
    from toolchain.records import read_runs
    first = deploy(settings, "slurm.json", "slurm", out=str(tmp_path / "a"))
    assert first.applied.written
    before = read_runs(settings.build_dir)["job1"]
    with pytest.raises((ToolchainError, DeployError)):
        deploy(settings, "slurm.json", "slurm", out=str(tmp_path / "b"), submit=True, env={"PATH": str(tmp_path)})
    assert read_runs(settings.build_dir)["job1"] == before
    (settings.build_dir / "runs.json").unlink()  # and a first deploy that fails leaves no record file at all
    with pytest.raises((ToolchainError, DeployError)):
        deploy(settings, "slurm.json", "slurm", out=str(tmp_path / "c"), submit=True, env={"PATH": str(tmp_path)})
    assert not (settings.build_dir / "runs.json").exists()


@pytest.mark.parametrize("spec,target,needle", [("slurm.json", "slurm", "#SBATCH --mem=5G"),
                                                ("kubernetes.json", "k8s", "memory: 5Gi"),
                                                ("kubernetes.json", "skypilot", "memory: 5+")])
def test_the_memory_setting_reaches_each_scheduler_and_a_bad_one_says_what_it_takes(settings, spec, target, needle):
    """deploy.memory (INVOKE_DEPLOY_MEMORY): the job's memory per node, in each scheduler's own form."""
    with_memory = settings.model_copy(update={"deploy": settings.deploy.model_copy(update={"memory": "5G"})})
    res = deploy(with_memory, spec, target, dry_run=True)
    assert needle in json.dumps(res.objects) + "".join((res.rendered or {}).values())
    bad = settings.model_copy(update={"deploy": settings.deploy.model_copy(update={"memory": "5X"})})
    with pytest.raises(DeployError, match=r"memory: .*\(got \"5X\"\); expected: Memory per node, e\.g\. 64G"):
        deploy(bad, spec, target, dry_run=True)


def test_a_deploy_says_when_the_code_changed_since_the_image_was_built(settings, tmp_path):
    """The job runs the image's code: an edit after the build (a new script --torchrun names, say) is said
    before anything is submitted; the code the image was built from is not."""
    import io
    import shutil
    from toolchain.hashing import tree_hash
    from toolchain.records import BuildRecord, write_builds
    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "train", app)
    settings = make_settings(tmp_path / "proj", app)
    record_images(settings, "slurm.json")
    write_builds(settings.build_dir, [BuildRecord(
        variant="cpu", local_ref="raytrain-cpu:x", human_ref="raytrain-cpu:latest", image_id="sha256:" + "9" * 64,
        spec_sha256=spec_hash(SPECS / "slurm.json"), base_ref="b:1", deps_ref="d:1", app_ref="a:1", torch_source="pypi",
        code_sha256=tree_hash(app))])

    def said() -> str:
        out = io.StringIO()
        pipeline.deploy(settings, str(SPECS / "slurm.json"), "slurm", rep=Reporter(stream=out), dry_run=True,
                        name="job1", gpus=0)
        return out.getvalue()
    assert "WARNING" not in said()
    (app / "extra.py").write_text("print('new')\n")
    warning = said()
    assert f"WARNING: the code in {app} changed since the cpu image was built; the job runs the image's code" \
        in warning and "build --variant cpu push" in warning, warning


@pytest.mark.parametrize("out,says", [
    ("-x", r"--out: '-x' starts with '-', as an option does"),
    ("/dev/null/x", r"--out: /dev/null is not a directory, so /dev/null/x cannot be made there"),
])
def test_an_out_that_cannot_hold_the_artifacts_is_refused_in_a_dry_run_too(settings, out, says):
    for dry_run in (True, False):
        with pytest.raises(ConfigError, match=says):
            deploy(settings, "slurm.json", "slurm", dry_run=dry_run, out=out)
    assert not (settings.build_dir / "deploy").exists()


@pytest.mark.parametrize("uri", ["s3://b/../../x", "s3://b//x", "gs://bucket/./runs", "s3://b/runs/."])
def test_a_fileroot_store_with_a_part_that_names_another_place_is_refused_naming_the_flag(settings, uri):
    with pytest.raises(Exception, match=r"--fileroot-store: an empty, '\.' or '\.\.' part names another place"):
        deploy(settings, "kubernetes.json", "skypilot", dry_run=True, fileroot_store=uri)
    res = deploy(settings, "kubernetes.json", "skypilot", dry_run=True, fileroot_store="s3://bucket/runs/team-a")
    assert "s3://bucket/runs/team-a" in next(iter(res.rendered.values()))

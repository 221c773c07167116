"""Every field of build/images.json and of the spec is input: hostile values in each, for every
target, end either in a clean refusal (exit 2, nothing written) or in artifacts that hand them over
as data. The scheduler CLIs are recording stubs: `sbatch` runs the script with stub `srun` and
`scontrol` (as a real sbatch would start it), `kubectl` and `sky` record what they are given; a
canary file shows any value that reached a shell as code."""
import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from conftest import make_settings
from deploy.registry import check as registry_check
from runtime.errors import InputError
from runtime.spec import spec_hash
from toolchain import pipeline
from toolchain.progress import Reporter

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
PAYLOADS = ["x\n$(touch {c})", "`touch {c}`", "'; touch {c}; '", "\"; touch {c} #", "$(touch {c})",
            "a\nb: {{c: *x}}"]
STUB = """#!/usr/bin/env python3
import json, os, subprocess, sys
name = os.path.basename(sys.argv[0])
rec = {"tool": name, "argv": sys.argv[1:], "stdin": sys.stdin.read() if "-f" in sys.argv and name == "kubectl" else ""}
with open(os.environ["RECORD_TO"], "a") as f:
    f.write(json.dumps(rec) + "\\n")
if name == "sbatch":   # run the script as Slurm would, with stub srun/scontrol on PATH
    r = subprocess.run(["bash", sys.argv[-1]], env={**os.environ, "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7"},
                       capture_output=True, text=True)
    print("7")
    sys.exit(0)
if name == "scontrol":
    print("n1\\nn2\\nn3")
if name == "kubectl" and sys.argv[1:3] == ["get", "namespace"]:  # pre-flight asks for the namespace
    print(json.dumps({"kind": "Namespace", "metadata": {"name": sys.argv[3], "labels": {}}}))
if "hostname" in sys.argv:
    print("10.0.0.1")
"""
TARGET_SPECS = {"slurm": "slurm.json", "pyxis": "slurm-pyxis.json", "k8s": "kubernetes.json",
                "skypilot": "kubernetes.json"}


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sbatch", "srun", "scontrol", "kubectl", "sky"):
        (bindir / tool).write_text(STUB)
        (bindir / tool).chmod(stat.S_IRWXU)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("RECORD_TO", str(record))
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    # the registries named here do not exist: the question to them (tested in test_registry_check.py) is
    # answered "yes", so every hostile value travels on to the scheduler stubs
    monkeypatch.setattr(registry_check, "check", lambda *a, **k: None)
    return record


def push_record(spec_name: str, **override) -> dict:
    base = {"repo_digest": "registry.example.com:5000/raytrain-gpu@sha256:" + "1" * 64,
            "spec_sha256": spec_hash(SPECS / spec_name), "spec_file": f"cluster_specs/{spec_name}",
            "registry": "registry.example.com:5000", "registry_scheme": "https", "user": "1000:1000",
            "local_ref": "raytrain-gpu:x", "image_id": "sha256:" + "2" * 64, "digest": "sha256:" + "1" * 64,
            "tags": ["x", "gpu-latest"]}
    return {**base, **override}


FIELDS = ["repo_digest", "spec_file", "registry", "user", "registry_scheme", "local_ref", "image_id", "digest", "tags"]


@pytest.mark.parametrize("target", sorted(TARGET_SPECS))
@pytest.mark.parametrize("field", FIELDS)
def test_hostile_images_json_fields(tmp_path, stubs, target, field):
    canary = tmp_path / f"canary-{uuid.uuid4().hex[:6]}"
    spec_name = TARGET_SPECS[target]
    for payload in PAYLOADS:
        value = payload.format(c=canary)
        settings = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
        rec = push_record(spec_name, **{field: [value] if field == "tags" else value})
        (settings.build_dir / "images.json").write_text(json.dumps({"cpu": rec, "gpu": rec}))
        out = tmp_path / "out"
        refused = False
        try:
            pipeline.deploy(settings, str(SPECS / spec_name), target, rep=Reporter(quiet=True), name="inj",
                            out=str(out), submit=True, gpus=0 if target != "k8s" else None,
                            env=dict(os.environ))
        except InputError as e:
            refused = e.exit_code == 2
        assert not canary.exists(), f"{field}={value!r} ran as code for {target}"
        if target != "slurm" and field in ("repo_digest", "digest", "spec_sha256", "registry_scheme"):
            assert refused, f"{field}={value!r} was accepted from images.json"


SPEC_PAYLOADS = {"cluster_name": "c\n$(touch {c})", "fileroot": "/x/$(touch {c})", "default_mount": "/a:/b`touch {c}`",
                 "node_name_prefix": "$(touch {c})"}


@pytest.mark.parametrize("target", sorted(TARGET_SPECS))
@pytest.mark.parametrize("field", sorted(SPEC_PAYLOADS))
def test_hostile_spec_fields(tmp_path, stubs, target, field):
    canary = tmp_path / f"canary-{uuid.uuid4().hex[:6]}"
    data = json.loads((SPECS / TARGET_SPECS[target]).read_text())
    data[field] = SPEC_PAYLOADS[field].format(c=canary)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    settings = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    rec = push_record(TARGET_SPECS[target], spec_sha256=spec_hash(spec))
    (settings.build_dir / "images.json").write_text(json.dumps({"cpu": rec, "gpu": rec}))
    try:
        pipeline.deploy(settings, str(spec), target, rep=Reporter(quiet=True), name="inj", out=str(tmp_path / "out"),
                        submit=True, gpus=0 if target != "k8s" else None, env=dict(os.environ))
    except InputError as e:
        assert e.exit_code == 2
    assert not canary.exists(), f"spec {field} ran as code for {target}"

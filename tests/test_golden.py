"""Golden files for the targets without a scheduler here to run them (k8s, skypilot) and the local
plan; the sbatch goldens (plain and Pyxis) are in test_sbatch.py. Each is rendered through the
target's own protocol from fixed inputs; a change is reviewed and rewritten with UPDATE_GOLDEN=1."""
import json
import os
from pathlib import Path

import pytest

from deploy.targets import TARGETS
from helpers import jobs
from runtime.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("target,spec_name,flags,golden", [
    ("k8s", "kubernetes.json", {}, "k8s.yaml"),
    ("k8s", "kubernetes.json", {"seeds": "1-2", "slots": "node1:0,node1:1"}, "k8s-seeds.yaml"),
    ("skypilot", "kubernetes.json", {"accelerator": "A100", "fileroot_store": "s3://bucket/runs"}, "skypilot.yaml"),
    ("local", "local.json", {}, "local.json"),
])
def test_golden(target, spec_name, flags, golden):
    spec = load_spec(ROOT / "cluster_specs" / spec_name)
    t = TARGETS[target]
    job = jobs.job(name="golden", nodes=3, gpus_per_node=t.spec_gpus(spec), cpus_per_node=8, memory="64G",
                   command=["python", "train.py", "--steps", "100"], env={"NCCL_DEBUG": "WARN"}, mounts=spec.mounts,
                   fileroot=spec.fileroot, workdir=t.job_workdir(ROOT), time_limit="02:00:00", retries=1)
    art = t.render(job, spec, t.parse_options(flags))
    text = "".join(f.text for f in art.files.values()) or json.dumps(art.objects, indent=2, default=str) + "\n"
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
        pytest.skip(f"UPDATE_GOLDEN: rewrote {path}; review the diff and run again without it")
    assert text == path.read_text(), f"rendering changed; review and rerun with UPDATE_GOLDEN=1 ({path})"

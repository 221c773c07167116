"""Rendering at scale: 1,000 seeds (k8s and SkyPilot fan-out) rendered and written, and a
1,000-node job (k8s and sbatch).

Run: .venv/bin/python bench/render_scale.py [--n 1000]
Prints seconds for each (render + serialise + write, best of 3, through the targets' own
render and the all-or-nothing writer) and, as a baseline from the same run, the time to serialise
the same objects with PyYAML's pure-Python safe_dump (ratio = ours / that; ours uses libyaml's
CSafeDumper). Target: < 1 s each.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.targets.slurm import sbatch  # noqa: E402
from deploy.artifacts import write_all  # noqa: E402
from deploy.job import ImageInfo, JobSpec  # noqa: E402
from deploy.targets import TARGETS, k8s  # noqa: E402
from runtime.imageref import ImageRef  # noqa: E402
from runtime.spec import load_spec  # noqa: E402

DIGEST = "registry.example.com:5000/raytrain-gpu@sha256:" + "ab" * 32


def render_and_write(target: str, job, spec, flags: dict, out: Path) -> int:
    t = TARGETS[target]
    art = t.render(job, spec, t.parse_options(flags))
    shutil.rmtree(out, ignore_errors=True)
    write_all(out, art.texts())
    return sum(len(f.text) for f in art.files.values())


def best(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    n = ap.parse_args().n
    kspec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    sspec = load_spec(ROOT / "cluster_specs" / "slurm-pyxis.json")
    ref = ImageRef.parse(DIGEST)
    job = JobSpec(name="bench", nodes=1, gpus_per_node=1, cpus_per_node=8, image=ref, command=["python", "train.py"],
                  mounts=kspec.mounts, fileroot=kspec.fileroot,
                  image_info=ImageInfo(ref=ref, spec_sha256="0" * 64, user="1000:1000"))
    slots = " ".join(f"node{i}:{g}" for i in range(125) for g in range(8))
    work = Path(tempfile.mkdtemp(prefix="render-bench-"))
    try:
        seeds = f"0-{n - 1}"
        t_seeds, size = best(lambda: render_and_write("k8s", job, kspec, {"seeds": seeds, "slots": slots}, work / "k"))
        objs = k8s.render_seeds(job, kspec.kubernetes, list(range(n)), [k8s.Slot.parse(x) for x in slots.split()])
        t_dump, _ = best(lambda: yaml.safe_dump_all(objs, sort_keys=False))  # pure-Python safe dumper
        print(f"k8s {n} seeds rendered + written: {t_seeds:.3f} s ({len(objs)} objects, {size / 2**20:.1f} MiB YAML); "
              f"pure-Python yaml.safe_dump alone {t_dump:.3f} s; ratio {t_seeds / t_dump:.2f}")
        t_sky, size = best(lambda: render_and_write("skypilot", job, kspec, {"seeds": seeds, "accelerator": "A100"},
                                                    work / "s"))
        print(f"skypilot {n} seeds rendered + written: {t_sky:.3f} s ({n} task files, {size / 2**20:.1f} MiB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    big = job.model_copy(update={"nodes": n})
    t_nodes, _ = best(lambda: k8s.dump(k8s.render(big, kspec.kubernetes)))
    print(f"k8s {n}-node job: {t_nodes * 1000:.1f} ms (an Indexed Job: size does not grow with nodes)")
    sjob = big.model_copy(update={"gpus_per_node": 8, "workdir": "/opt/app/project"})
    t_sbatch, script = best(lambda: sbatch.render(sjob, partition=sspec.slurm.partition, image=ref.pyxis()))
    print(f"sbatch {n}-node job: {t_sbatch * 1000:.2f} ms ({len(script.splitlines())} lines)")
    worst = max(t_seeds, t_sky, t_nodes, t_sbatch)
    print(f"target < 1 s: {'met' if worst < 1 else 'MISSED'} (worst {worst:.3f} s)")


if __name__ == "__main__":
    main()

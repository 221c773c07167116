"""One-line change -> first training step: a fresh deploy against a held cluster (invoke up once, then
invoke run), with N nodes, in the same run: on the local target, or on a real Slurm on this host.

Both paths start from the same project. Per round, the same one-line change to train.py (a new
marker in the worker's step line), then:
  local  fresh: build + push (the app layer only) + deploy --target local (new containers, Ray, barrier);
         held:  run on the cluster `up` started before the rounds (the code only, as Ray's working_dir).
         The image is built and pushed once before the rounds (not timed).
  slurm  (three `slurmd` on this host, plain sbatch: the nodes run this tree's environment, no image)
         fresh: deploy --target slurm --submit (a new job: srun steps, Ray, barrier), its log watched;
         held:  run on the job `up` submitted (an srun step into it, the code on its stdin).
         The fresh rounds run first, then `up`: both jobs would not fit the three 2-CPU nodes at once.
The clock stops when the changed line of step 1 appears (in the output, or in the job's log). Medians
over --rounds; the ratio is fresh / held. `up` itself is timed once and printed apart (it is paid
once per session).
Run: .venv/bin/python bench/warm_loop.py [--target local|slurm] [--nodes 3 --rounds 3]
     (local needs the Docker engine; slurm needs slurm-wlm and munge, as scripts/setup.sh installs)
"""
from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import SPEC, make_settings  # noqa: E402
from toolchain import held, pipeline  # noqa: E402
from toolchain.config import DeploySettings  # noqa: E402
from toolchain.progress import Reporter  # noqa: E402
from toolchain.publish.local_registry import start_local, stop_local  # noqa: E402

LINE = 'print(f"step {self.step} loss {value:.5f}", flush=True)'
COMMAND = "python train.py --steps 3 --cpus-per-worker 0.5 --no-spares"


class Watch(io.TextIOBase):
    """A stdout that notes when a line with the marker is first written."""

    def __init__(self, marker: str):
        self.marker, self.seen, self.t0 = marker, threading.Event(), time.monotonic()
        self.at = None

    def write(self, text: str) -> int:
        if self.at is None and self.marker in text and "step 1 loss" in text:
            self.at = time.monotonic() - self.t0
            self.seen.set()
        return len(text)


def change(app: Path, marker: str) -> None:
    train = app / "train.py"
    text = train.read_text()
    start = text.index('print(f"step {self.step} loss')
    end = text.index("\n", start)
    train.write_text(text[:start] + LINE.replace('.5f}"', '.5f} ' + marker + '"') + text[end:])


def timed(fn, marker: str) -> float:
    watch = Watch(marker)
    with redirect_stdout(watch):
        fn()
    if watch.at is None:
        raise RuntimeError(f"the changed line ({marker}) never appeared in step 1")
    return watch.at


def watch_log(log: Path, marker: str, t0: float, timeout_s: float = 600) -> float:
    """Seconds from T0 until step 1's changed line is in the job's LOG."""
    while time.monotonic() - t0 < timeout_s:
        text = log.read_text(errors="replace") if log.exists() else ""
        if any(marker in line and "step 1 loss" in line for line in text.splitlines()):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError(f"the changed line ({marker}) never appeared in {log}")


def report(target: str, nodes: int, rounds: int, fresh: list, warm: list, up_s: float, fresh_what: str) -> None:
    f, w = statistics.median(fresh), statistics.median(warm)
    print(f"\none-line change -> first step, {nodes} {target} nodes, median of {rounds}:")
    for label, value in ((f"fresh deploy ({fresh_what}):", f"{f:6.2f} s"), ("held cluster (invoke run):", f"{w:6.2f} s"),
                         ("ratio fresh/held:", f"{f / w:6.1f}x")):
        print(f"  {label:<40}{value}")
    print(f"  (invoke up, once: {up_s:.2f} s)")


def local(args, work: Path, app: Path, rep: Reporter) -> None:
    s = make_settings(work / "proj", app, runtime_dir=work / "runtime")
    name = f"warm-{uuid.uuid4().hex[:6]}"
    s = s.model_copy(update={"deploy": DeploySettings(name=name, nodes=args.nodes,
                                                      command=COMMAND.split())})
    reg = start_local(s, rep)
    try:
        pipeline.build(s, str(SPEC), "cpu", rep)
        pipeline.push(s, str(SPEC), "cpu", rep)
        t0 = time.monotonic()
        held.up(s, str(SPEC), "local", rep=rep, name=name, nodes=args.nodes)
        up_s = time.monotonic() - t0
        fresh, warm = [], []
        try:
            for i in range(args.rounds):
                marker = f"FRESH{i}-{uuid.uuid4().hex[:4]}"
                change(app, marker)

                def fresh_path():
                    pipeline.build(s, str(SPEC), "cpu", rep)
                    pipeline.push(s, str(SPEC), "cpu", rep)
                    pipeline.deploy(s, str(SPEC), "local", rep=rep, name=f"{name}-f", nodes=args.nodes)
                fresh.append(timed(fresh_path, marker))
                marker = f"HELD{i}-{uuid.uuid4().hex[:4]}"
                change(app, marker)
                warm.append(timed(lambda: held.run(s, str(SPEC), rep=rep, name=name), marker))
                print(f"round {i + 1}: fresh {fresh[-1]:.2f} s, held {warm[-1]:.2f} s", flush=True)
        finally:
            held.down(s, rep=rep, name=name)
        report("local", args.nodes, args.rounds, fresh, warm, up_s, "build + push + deploy")
    finally:
        if reg.started_here:
            stop_local(s)
            shutil.rmtree(s.registry.data_dir, ignore_errors=True)


def slurm(args, work: Path, app: Path, rep: Reporter) -> None:
    import json
    import os
    from helpers.slurm import SlurmCluster
    cluster = SlurmCluster(work / "slurm", nodes=args.nodes, ctld_port=16957, node_port=17201).start()
    try:
        fileroot = work / "fileroot"
        spec = work / "seed.json"
        spec.write_text(json.dumps({
            "cluster_type": "slurm", "cluster_name": "bench", "fileroot": str(fileroot), "cpu_image": "raytrain-cpu",
            "gpu_image": "raytrain-gpu", "node_type_from_node_name": {"n\\d$": "cpu"}, "node_name_prefix": "n"}))
        name = f"warm-{uuid.uuid4().hex[:6]}"
        s = make_settings(work / "proj", app, runtime_dir=ROOT / "runtime")  # the runtime the nodes import
        s = s.model_copy(update={"deploy": DeploySettings(name=name, nodes=args.nodes, port_base=26000,
                                                          time_limit="15:00",
                                                          command=[*COMMAND.split(), "--fileroot", str(fileroot)])})
        env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        fresh, warm = [], []
        for i in range(args.rounds):
            marker = f"FRESH{i}-{uuid.uuid4().hex[:4]}"
            change(app, marker)
            t0 = time.monotonic()
            job = f"{name}-f{i}"
            res = pipeline.deploy(s, str(spec), "slurm", rep=rep, name=job, nodes=args.nodes, submit=True,
                                  port_stride=200, out=str(work / "out"), env=env)
            fresh.append(watch_log(fileroot / "logs" / f"{job}-{res.applied.slurm_job_id}.out", marker, t0))
            cluster.wait(res.applied.slurm_job_id, timeout_s=300)
            print(f"round {i + 1}: fresh {fresh[-1]:.2f} s", flush=True)
        t0 = time.monotonic()
        held.up(s, str(spec), "slurm", rep=rep, name=name, nodes=args.nodes, port_stride=200, env=env)
        up_s = time.monotonic() - t0
        try:
            for i in range(args.rounds):
                marker = f"HELD{i}-{uuid.uuid4().hex[:4]}"
                change(app, marker)
                warm.append(timed(lambda: held.run(s, str(spec), rep=rep, name=name, env=env), marker))
                print(f"round {i + 1}: held {warm[-1]:.2f} s", flush=True)
        finally:
            held.down(s, rep=rep, name=name, env=env)
        report("Slurm", args.nodes, args.rounds, fresh, warm, up_s, "a new sbatch job")
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("local", "slurm"), default="local")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rep = Reporter(quiet=True)
    work = Path(tempfile.mkdtemp(prefix="warm-loop-"))
    app = work / "app"
    shutil.copytree(ROOT / "examples" / "train", app, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "runtime", work / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    try:
        (local if args.target == "local" else slurm)(args, work, app, rep)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

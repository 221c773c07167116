"""Worker-group training step time vs plain torchrun DDP: same model, data, world size and threads.

Run: .venv/bin/python bench/step_time.py [--world 2 --steps 30 --width 1024]
Prints ms/step for both (after warm-up) and the ratio worker-group / torchrun.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TORCHRUN_SCRIPT = r'''
import os, sys, time, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from bench.step_time import make_model, make_batch
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(make_model({width}))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
for step in range({steps}):
    b = make_batch(step, {batch}, {width}).shard_by_batch_size(world)[rank]
    t0 = time.perf_counter()
    loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"]); opt.zero_grad(); loss.backward(); opt.step()
    dist.barrier()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print("MS", 1000 * sum(times[{warmup}:]) / len(times[{warmup}:]))
'''


def make_model(width: int):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 1))


def make_batch(step: int, batch: int, width: int):
    import torch
    from runtime.batched import BatchedDataDict
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, width, generator=g)
    return BatchedDataDict({"x": x, "y": x.sum(1, keepdim=True)})


class StepWorker:
    def __init__(self, width: int):
        import torch
        torch.set_num_threads(1)
        self.model = torch.nn.parallel.DistributedDataParallel(make_model(width))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, b):
        import torch
        loss = torch.nn.functional.mse_loss(self.model(b["x"]), b["y"])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def worker_group_ms(args) -> float:
    import ray
    from runtime.virtual_cluster import RayVirtualCluster
    from runtime.worker_group import RayWorkerGroup
    ray.init(num_cpus=args.world, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, logging_level="ERROR")
    vc = RayVirtualCluster([args.world])
    g = RayWorkerGroup(vc, StepWorker, init_kwargs={"width": args.width})
    times = []
    for step in range(args.steps):
        b = make_batch(step, args.batch, args.width)
        t0 = time.perf_counter()
        g.run_all_workers_sharded_batch("step", b)
        times.append(time.perf_counter() - t0)
    g.shutdown()
    vc.shutdown()
    ray.shutdown()
    return 1000 * sum(times[args.warmup:]) / len(times[args.warmup:])


def torchrun_ms(args) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TORCHRUN_SCRIPT.format(root=str(ROOT), width=args.width, steps=args.steps, batch=args.batch,
                                       warmup=args.warmup))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.world}",
                          "--master-port=29533", f.name], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.unlink(f.name)
    line = next((l for l in out.stdout.splitlines() if l.startswith("MS ")), None)
    if line is None:
        raise SystemExit(f"torchrun failed:\n{out.stderr[-2000:]}")
    return float(line.split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=1024)
    args = p.parse_args()
    tr = torchrun_ms(args)
    wg = worker_group_ms(args)
    print(f"model MLP width {args.width}, batch {args.batch}, world {args.world}, 1 thread per rank")
    print(f"  torchrun DDP      {tr:8.1f} ms/step")
    print(f"  worker group DDP  {wg:8.1f} ms/step   ratio {wg / tr:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()

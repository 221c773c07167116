"""Worker-group DDP step time against plain torchrun and Ray Train's TorchTrainer, in one run.

Same model (MLP, width 1024), same world size (2 ranks x 1 thread), same shard sizes. Prints:
- per-call overhead of run_all_workers_single_data against bare Ray actor calls (the floor);
- ms/step at the small step (batch 256) and at a realistic one (the batch sized here for
  --realistic-ms, 200 ms): torchrun; the worker group's own ranks looping by themselves, as
  torchrun's ranks do; the worker group with workers making their own shard (ShardLoader); the
  worker group with the driver sharding each batch and sending it (object store, zero-copy); and Ray
  Train's TorchTrainer if `ray[train]`'s extras are installed (else it says so).
Every variant's step includes making its rank's data. torchrun, TorchTrainer and the ranks looping
alone time the step inside the rank (compute + all-reduce + a barrier); the worker group times it
on the driver, so its figure also holds the dispatch and the result's return. Figures are medians.
torchrun runs as its own processes, before the group's turn, so machine load between the two moves
that ratio (+-0.1 seen on these 2 cores); the group's variants and its ranks looping alone take turns
every --block steps on the same processes, so that ratio is the group's own cost per step.
Run: .venv/bin/python bench/step_time.py [--rounds 3 --steps 40]
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

WIDTH = 1024
SMALL_BATCH = 256  # global batch of the small step (~25-35 ms on 2 cores); the realistic one is calibrated

TORCHRUN_SCRIPT = r'''
import sys, time, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from bench.step_time import make_model, median_ms, timed_step
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(make_model({width}))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for name, batch in {configs!r}.items():
    times = [timed_step(model, opt, step, rank, world, batch, {width}) for step in range({steps})]
    if rank == 0:
        print("MS", name, median_ms(times, {warmup}), flush=True)
'''


def make_model(width: int):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 1))


def make_shard(step: int, rank: int, world: int, batch: int, width: int):
    """One rank's part of a step's batch, made where it is used."""
    import torch
    from runtime.workers.batched import BatchedDataDict
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch // world, width, generator=g)
    return BatchedDataDict({"x": x, "y": x.sum(1, keepdim=True)})


def shard_loader(rank: int, world: int, step: int, batch: int, width: int):
    return make_shard(step, rank, world, batch, width)


def make_batch(step: int, batch: int, width: int):
    """The whole batch, made on the driver (the driver-sharded variant)."""
    import torch
    from runtime.workers.batched import BatchedDataDict
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, width, generator=g)
    return BatchedDataDict({"x": x, "y": x.sum(1, keepdim=True)})


def train_step(model, opt, b) -> float:
    import torch
    loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"])
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def timed_step(model, opt, step, rank, world, batch, width) -> float:
    """Inside a rank (torchrun, TorchTrainer): make the shard, step, barrier."""
    import torch.distributed as dist
    t0 = time.perf_counter()
    train_step(model, opt, make_shard(step, rank, world, batch, width))
    dist.barrier()
    return time.perf_counter() - t0


class StepWorker:
    def __init__(self, width: int):
        import torch
        torch.set_num_threads(1)
        self.model = torch.nn.parallel.DistributedDataParallel(make_model(width))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, b):
        return train_step(self.model, self.opt, b)

    def loop(self, start: int, n: int, batch: int, width: int) -> list:
        """n steps timed inside the rank, as torchrun's ranks run them (the same timed_step)."""
        import os
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return [timed_step(self.model, self.opt, step, rank, world, batch, width) for step in range(start, start + n)]

    def noop(self):
        return None


def median_ms(times: list, warmup: int) -> float:
    """The median after the warm-up: one step slowed by another process on these 2 cores moves a
    mean by its whole excess, a median not at all."""
    kept = sorted(times[warmup:])
    return 1000 * kept[len(kept) // 2]


def torchrun_ms(args) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TORCHRUN_SCRIPT.format(root=str(ROOT), width=WIDTH, steps=args.steps, warmup=args.warmup,
                                       configs=args.configs))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.world}",
                          "--master-port=29533", f.name], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.unlink(f.name)
    ms = {l.split()[1]: float(l.split()[2]) for l in out.stdout.splitlines() if l.startswith("MS ")}
    if len(ms) != len(args.configs):
        raise SystemExit(f"torchrun failed:\n{out.stderr[-2000:]}")
    return ms


class GroupBench:
    """One Ray session and worker group, measured once per round."""

    def __init__(self, args):
        import ray
        from runtime.workers.virtual_cluster import RayVirtualCluster
        from runtime.workers.worker_group import RayWorkerGroup
        self.args = args
        # logical CPUs: the group's bundles, TorchTrainer's workers and its controller (all share 2 real cores)
        # address="local": a cluster of its own, never one a test or a job left in /tmp/ray/ray_current_cluster
        ray.init(address="local", num_cpus=2 * args.world + 1, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}},
                 logging_level="ERROR", log_to_driver=False)

        @ray.remote(num_cpus=0)
        class Bare:
            def noop(self):
                return None
        self.bare = [Bare.remote() for _ in range(args.world)]
        self.vc = RayVirtualCluster([args.world])
        self.g = RayWorkerGroup(self.vc, StepWorker, init_kwargs={"width": WIDTH})
        ray.get([b.__ray_ready__.remote() for b in self.bare])

    def measure(self) -> dict:
        import ray
        from runtime.workers.transfer import ShardLoader
        args, g, out = self.args, self.g, {}
        for name, call in (("bare", lambda: ray.get([b.noop.remote() for b in self.bare])),
                           ("group", lambda: g.run_all_workers_single_data("noop"))):
            for _ in range(20):
                call()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            out[f"call_{name}"] = 1000 * (time.perf_counter() - t0) / args.calls
        for name, batch in args.configs.items():
            own, sent, alone = [], [], []
            for start in range(0, args.steps, args.block):  # in turn, block by block: both see the same load
                for step in range(start, min(start + args.block, args.steps)):
                    t0 = time.perf_counter()
                    g.run_all_workers_own_shard("step", ShardLoader(shard_loader, step, batch, WIDTH))
                    own.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    g.run_all_workers_sharded_batch("step", make_batch(step, batch, WIDTH))
                    sent.append(time.perf_counter() - t0)
                n = min(args.block, args.steps - start)
                alone += g.run_all_workers_single_data("loop", start, n, batch, WIDTH)[0]
            out[f"own_{name}"], out[f"sent_{name}"] = median_ms(own, args.warmup), median_ms(sent, args.warmup)
            out[f"alone_{name}"] = median_ms(alone, args.warmup)
        return out

    def close(self) -> None:
        import ray
        self.g.shutdown()
        self.vc.shutdown()
        ray.shutdown()


def torch_trainer(args) -> dict:
    """Ray Train's TorchTrainer on the same model and shards, in the bench's Ray session."""
    import json
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def loop(config):
        import torch
        import ray.train
        import ray.train.torch
        sys.path.insert(0, config["root"])
        from bench.step_time import make_model, median_ms, timed_step
        torch.set_num_threads(1)
        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        model = ray.train.torch.prepare_model(make_model(config["width"]))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ms = {}
        for name, batch in config["configs"].items():
            times = [timed_step(model, opt, s, rank, world, batch, config["width"]) for s in range(config["steps"])]
            ms[name] = median_ms(times, config["warmup"])
        if rank == 0:  # written to a file: Ray Train V2 keeps reported metrics only with checkpoints
            with open(config["out"], "w") as f:
                json.dump(ms, f)

    with tempfile.TemporaryDirectory() as storage:
        out = os.path.join(storage, "ms.json")
        trainer = TorchTrainer(loop, train_loop_config={"root": str(ROOT), "width": WIDTH, "configs": args.configs,
                                                        "steps": args.steps, "warmup": args.warmup, "out": out},
                               scaling_config=ScalingConfig(num_workers=args.world, use_gpu=False,
                                                            resources_per_worker={"CPU": 1}),
                               run_config=RunConfig(storage_path=storage, name="step_time"))
        trainer.fit()
        with open(out) as f:
            return json.load(f)


def calibrate(target_ms: float, world: int, width: int) -> int:
    """The global batch whose step takes about target_ms on this machine: one rank's share timed
    here, alone, with one thread (DDP's all-reduce adds a little; the printed torchrun figure is
    what counts)."""
    import torch
    torch.set_num_threads(1)
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = 1024
    times = []
    for step in range(8):
        t0 = time.perf_counter()
        train_step(model, opt, make_shard(step, 0, 1, probe, width))
        times.append(time.perf_counter() - t0)
    return max(64, round(probe * world * target_ms / median_ms(times, 3) / 64) * 64)


def ratio(r: dict, key: str, name: str) -> str:
    return (f"{r[f'{key}_{name}']:6.1f} ms ({r[f'{key}_{name}'] / r['torchrun'][name]:.3f}x torchrun, "
            f"{r[f'{key}_{name}'] / r[f'alone_{name}']:.3f}x the ranks alone)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=5,
                   help="Steps per turn when the group's variants and the ranks alone take turns.")
    p.add_argument("--realistic-ms", type=float, default=200, help="Step time the realistic batch is sized for.")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--no-ray-train", action="store_true")
    args = p.parse_args()
    if not args.no_ray_train:
        try:
            import ray.train.torch  # noqa: F401
        except ImportError as e:
            args.no_ray_train = f"not run: ray[train]'s extras are not installed ({e})"
    args.configs = {"small": SMALL_BATCH, "realistic": calibrate(args.realistic_ms, args.world, WIDTH)}
    bench = GroupBench(args)
    rounds = []
    try:
        for _ in range(args.rounds):
            r = {"load": os.getloadavg()[0], "torchrun": torchrun_ms(args), **bench.measure()}
            r["trainer"] = None if args.no_ray_train else torch_trainer(args)
            rounds.append(r)
    finally:
        bench.close()
    print(f"MLP width {WIDTH}, {args.world} ranks x 1 thread, {args.steps} steps ({args.warmup} warm-up), medians, "
          f"{args.rounds} rounds; 2-core machine, CPU only")
    for i, r in enumerate(rounds):
        print(f"round {i + 1} (load {r['load']:.2f} before it)")
        print(f"  per call, no-op on {args.world} workers: bare Ray actor calls {r['call_bare']:.3f} ms, "
              f"run_all_workers_single_data {r['call_group']:.3f} ms (overhead {r['call_group'] - r['call_bare']:+.3f} ms)")
        for name, batch in args.configs.items():
            line = (f"  {name:9s} step (batch {batch:4d}): torchrun {r['torchrun'][name]:6.1f} ms | the group's ranks "
                    f"looping alone {r[f'alone_{name}']:6.1f} ms | worker group, workers load their shard "
                    f"{ratio(r, 'own', name)} | driver sends shards {ratio(r, 'sent', name)}")
            if r["trainer"]:
                line += f" | TorchTrainer {r['trainer'][name]:6.1f} ms ({r['trainer'][name] / r['torchrun'][name]:.3f}x torchrun)"
            print(line)
    if args.no_ray_train:
        print(f"Ray Train TorchTrainer: {args.no_ray_train if isinstance(args.no_ray_train, str) else 'not run (--no-ray-train)'}"
              "; install with `.venv/bin/pip install \"ray[train]==<ray version>\"`")
    for key, what in (("own", "workers load their shard"), ("sent", "driver sends shards")):
        vs_run = sorted(r[f"{key}_realistic"] / r["torchrun"]["realistic"] for r in rounds)
        vs_alone = sorted(r[f"{key}_realistic"] / r["alone_realistic"] for r in rounds)
        print(f"realistic step, {what}: median over rounds {vs_run[len(vs_run) // 2]:.3f}x torchrun "
              f"(range {vs_run[0]:.3f}-{vs_run[-1]:.3f}), {vs_alone[len(vs_alone) // 2]:.3f}x the same ranks looping "
              f"alone, in turn (range {vs_alone[0]:.3f}-{vs_alone[-1]:.3f})")
    print(f"load after: {os.getloadavg()[0]:.2f}. target: worker group <= 1.05x torchrun at the realistic step")


if __name__ == "__main__":
    main()

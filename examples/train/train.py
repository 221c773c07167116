"""Example training job: data-parallel linear regression on synthetic data over a RayWorkerGroup.

Runs on the head under `python -m runtime launch -- python train.py`, or alone with a local Ray.
Each worker is a DDP rank. When the job has GPUs (the spec's or `deploy --gpus`: Ray then counts them),
each rank gets one (`use_gpus`: CUDA_VISIBLE_DEVICES per rank), trains on cuda:0 of what it sees, over
nccl; otherwise on the CPU over gloo. The same code either way. Rank 0 checkpoints to
<fileroot>/checkpoints/<job>/<run id>, and every rank reloads the last checkpoint (onto its own device)
when the group is (re)started.

Every run leaves pictures: TensorBoard event files (torch.utils.tensorboard) under
<fileroot>/runs/<job>/<run id>/: each rank's own in rank<k>/ (per step: loss, step time, samples per
second), and the driver's in driver/ (the startup breakdown, once per start). A resumed run writes to
the same directory and its steps go on from the checkpoint's: one curve.
"""
from __future__ import annotations

import time

STARTED_AT = time.time()  # before the imports: the startup breakdown counts them

import argparse
import json
import os
import sys

import ray
import torch

from runtime.workers.batched import BatchedDataDict
from runtime.spec import load_spec
from runtime.workers.transfer import ShardLoader
from runtime.workers.virtual_cluster import RayVirtualCluster
from runtime.workers.worker_group import RayWorkerGroup, WorkerFailureError, WorkerGroupRestarted

FEATURES = 16


def device_of(use_gpu: bool) -> torch.device:
    """cuda:0 of the GPU this rank was given (use_gpus sets CUDA_VISIBLE_DEVICES per rank), or the CPU."""
    if use_gpu and not torch.cuda.is_available():
        raise RuntimeError(f"rank {os.environ.get('RANK')}: the job has GPUs, but torch sees none here "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): use the gpu image")
    return torch.device("cuda", 0) if use_gpu else torch.device("cpu")


def events(runs_dir: str, who: str, resumed_at: int):
    """This process's TensorBoard writer in <runs_dir>/<who>; a resumed run drops what a failed attempt
    wrote past the checkpoint (purge_step) and goes on from there."""
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(log_dir=os.path.join(runs_dir, who), purge_step=resumed_at + 1 if resumed_at else None,
                         flush_secs=5)


class Trainer:
    def __init__(self, ckpt_dir: str, lr: float, seed: int, step_delay_s: float = 0.0, use_gpu: bool = False,
                 runs_dir: str = "", started_at: float = 0.0):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.rank = int(os.environ["RANK"])
        self.device = device_of(use_gpu)
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        model = torch.nn.Linear(FEATURES, 1).to(self.device)
        self.model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.step, self.step_delay_s = 0, step_delay_s
        self.started_at = started_at or time.time()  # the driver's start: step lines say seconds since
        self.ckpt = os.path.join(ckpt_dir, "ckpt.pt")
        if os.path.exists(self.ckpt):
            state = torch.load(self.ckpt, weights_only=True, map_location=self.device)  # saved on either device
            self.model.module.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.step = int(state["step"])
            print(f"resumed from checkpoint at step {self.step}", flush=True)
        self.events = events(runs_dir, f"rank{self.rank}", self.step) if runs_dir else None
        dist.barrier()

    def train_step(self, batch: BatchedDataDict) -> dict:
        t0 = time.perf_counter()
        batch = batch.to(self.device)
        loss = torch.nn.functional.mse_loss(self.model(batch["x"]), batch["y"])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        value = loss.item()  # waits for the device: the step time below is the step's
        self.step += 1
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        dt = time.perf_counter() - t0
        if self.events is not None:
            self.events.add_scalar("loss", value, self.step)
            self.events.add_scalar("step_time_s", dt, self.step)
            self.events.add_scalar("samples_per_s", len(batch["x"]) / dt, self.step)
        # the line tests and benches edit
        print(f"step {self.step} loss {value:.5f} at {time.time() - self.started_at:.2f}s", flush=True)
        return {"rank": self.rank, "step": self.step, "loss": value, "device": str(self.device),
                "backend": torch.distributed.get_backend()}

    def close_events(self) -> None:
        if self.events is not None:
            self.events.close()

    def save(self) -> int:
        if self.events is not None:
            self.events.flush()
        if self.rank == 0:
            os.makedirs(os.path.dirname(self.ckpt), exist_ok=True)
            tmp = self.ckpt + ".tmp"
            torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(), "step": self.step}, tmp)
            os.replace(tmp, self.ckpt)
        return self.step

    def get_step(self) -> int:
        return self.step


def batch_for(step: int, batch_size: int, seed: int) -> BatchedDataDict:
    true_w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(batch_size, FEATURES, generator=g)
    return BatchedDataDict({"x": x, "y": x @ true_w + 0.01 * torch.randn(batch_size, 1, generator=g)})


def shard_for(rank: int, world_size: int, step: int, batch_size: int, seed: int) -> BatchedDataDict:
    """This rank's part of step `step`'s batch, made on the worker (the same samples the driver
    would have sent it)."""
    return batch_for(step, batch_size, seed).shard_by_batch_size(world_size)[rank]


def default_fileroot() -> str:
    path = os.environ.get("CLUSTER_SPEC_PATH")
    return load_spec(path).fileroot if path else "/tmp/raytrain"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--workers-per-node", type=int, default=1)
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPU share of each worker's bundle.")
    p.add_argument("--nodes", type=int, default=0, help="Nodes to use (default: every alive Ray node).")
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--max-restarts", type=int, default=2)
    p.add_argument("--call-timeout", type=float, default=120)
    p.add_argument("--step-delay", type=float, default=0.0, help="Sleep per step (to make failures easy to inject).")
    p.add_argument("--fileroot", default=None, help="Default: the spec's fileroot.")
    p.add_argument("--job-name", default=os.environ.get("RAYTRAIN_JOB_NAME", "example"))
    p.add_argument("--run-id", default=os.environ.get("RAYTRAIN_RUN_ID", ""),
                   help="Checkpoints go to <fileroot>/checkpoints/<job name>/<run id>: each deploy is a new run "
                        "(deploy --resume, or a scheduler's restart, continues one). Default: $RAYTRAIN_RUN_ID.")
    p.add_argument("--data", choices=("worker", "driver"), default="worker",
                   help="worker: each worker makes its own shard; driver: the driver shards each batch and sends it.")
    p.add_argument("--no-spares", dest="spares", action="store_false",
                   help="Do not keep spare workers (started, torch imported) for fast restarts.")
    args = p.parse_args(argv)

    imported = time.time()
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=True)
    connected = time.time()
    # RAYTRAIN_TRAIN_NODES: the job's nodes beyond it are spares, which the group moves lost ranks onto
    nodes = args.nodes or int(os.environ.get("RAYTRAIN_TRAIN_NODES") or 0) or len([n for n in ray.nodes() if n["Alive"]])
    fileroot = args.fileroot or default_fileroot()
    ckpt_dir = os.path.join(fileroot, "checkpoints", args.job_name, args.run_id)
    runs_dir = os.path.join(fileroot, "runs", args.job_name, args.run_id or "default")
    use_gpus = ray.cluster_resources().get("GPU", 0) >= 1  # the job's GPUs: the spec's, or deploy --gpus
    t0 = time.monotonic()
    cluster = RayVirtualCluster([args.workers_per_node] * nodes, num_cpus_per_bundle=args.cpus_per_worker,
                                use_gpus=use_gpus)
    placed = time.time()
    group = RayWorkerGroup(cluster, Trainer, init_kwargs=dict(ckpt_dir=ckpt_dir, lr=args.lr, seed=args.seed,
                                                              step_delay_s=args.step_delay, use_gpu=use_gpus,
                                                              runs_dir=runs_dir, started_at=STARTED_AT),
                           restart_on_failure=True, max_restarts=args.max_restarts, call_timeout_s=args.call_timeout,
                           spare_workers=args.spares)
    st = group.last_start
    print(f"[driver] world size {group.world_size} on {nodes} nodes, checkpoints in {ckpt_dir}", flush=True)
    print(f"[driver] startup: process start {STARTED_AT:.3f}; imports {imported - STARTED_AT:.2f} s; "
          f"ray.init {connected - imported:.2f} s; placement groups {placed - connected:.2f} s; "
          f"group {time.time() - placed:.2f} s (warm hosts adopted after {st['adopt_s']:.2f} s, "
          f"hosts {st['hosts_s']:.2f} s, {st['spares_used']} taken from spares, "
          f"torch import {st['import_s']:.2f} s, process group {st['dist_init_s']:.2f} s, "
          f"worker init {st['worker_init_s']:.2f} s)", flush=True)
    step = start_step = group.run_all_workers_single_data("get_step")[0]
    with events(runs_dir, "driver", 0) as startup:
        for name, seconds in (("imports", imported - STARTED_AT), ("ray_init", connected - imported),
                              ("placement_groups", placed - connected), ("group_start", time.time() - placed)):
            startup.add_scalar(f"startup/{name}_s", seconds, start_step)
    first_loss = last_loss = None
    devices = set()
    ranks = set()
    try:
        while step < args.steps:
            try:
                if args.data == "worker":
                    res = group.run_all_workers_own_shard("train_step", ShardLoader(shard_for, step, args.batch_size,
                                                                                    args.seed))
                else:
                    res = group.run_all_workers_sharded_batch("train_step", batch_for(step, args.batch_size, args.seed))
            except WorkerGroupRestarted as e:
                step = group.run_all_workers_single_data("get_step")[0]
                print(f"[driver] {e}; resuming at step {step} at {time.time() - STARTED_AT:.2f}s", flush=True)
                continue
            step = res[0]["step"]
            last_loss = sum(r["loss"] for r in res) / len(res)
            first_loss = last_loss if first_loss is None else first_loss
            ranks.update(r["rank"] for r in res)
            devices.update(f"{r['device'].split(':')[0]}/{r['backend']}" for r in res)
            # each rank prints its own step line (Trainer.train_step); the driver prints none of its own
            if step % args.ckpt_every == 0 or step == args.steps:
                group.run_all_workers_single_data("save")
    except WorkerFailureError as e:
        print(f"[driver] FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    if step == start_step:
        print(f"[driver] NOTHING TRAINED: run {args.run_id or args.job_name} is already at step {step} of "
              f"{args.steps}; deploy without --resume for a new run, or raise --steps", file=sys.stderr, flush=True)
    summary = {"steps": step, "trained_steps": step - start_step, "first_loss": first_loss, "final_loss": last_loss,
               "world_size": group.world_size,
               "nodes": nodes, "ranks_reported": sorted(ranks), "restarts": group.restarts,
               "seconds": round(time.monotonic() - t0, 2), "devices": sorted(devices)}
    group.run_all_workers_single_data("close_events")
    group.flush_output()  # the ranks' last lines before the summary, not after it
    print("SUMMARY " + json.dumps(summary), flush=True)
    print(f"[driver] curves: {runs_dir} (tensorboard --logdir {runs_dir})", flush=True)
    group.shutdown()
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A NeMo RL-style sharded call on 3 workers against bare Ray actor calls, in ms, in one run.

The same 3 actors' worth of work both ways: a BatchedDataDict of --rows rows x --width floats split in
3 data-parallel shards, each worker returning the sum of its shard.
- bare: three `ray.remote` actors, `ray.get([a.step.remote(shard_i) ...])` with the shards as they are;
- face: runtime.nemo_rl's RayWorkerGroup over a RayVirtualCluster([3]) with NamedSharding(dp=3),
  `run_all_workers_sharded_data("step", data=shards, in_sharded_axes=["dp"])` and
  `get_all_worker_results(...)`, as NeMo RL code calls it.
Both sides shard the batch first (inside the timed call), so the difference is the face's dispatch.
Medians over --calls calls after --warmup; the two take turns every --block calls.
Run: .venv/bin/python bench/nemo_dispatch.py [--calls 200 --rows 3072 --width 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Summer:
    """The worker both sides run: the sum of its shard."""

    def __init__(self, *args, **kwargs):
        pass

    def step(self, data):
        return float(data["x"].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="timed calls per side")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls per side first")
    ap.add_argument("--block", type=int, default=10, help="calls per side before the other side's turn")
    ap.add_argument("--rows", type=int, default=3072, help="rows of the batch (divisible by 3)")
    ap.add_argument("--width", type=int, default=64, help="floats per row")
    args = ap.parse_args()
    import ray
    import torch

    from runtime.workers.batched import BatchedDataDict
    from runtime.nemo_rl.named_sharding import NamedSharding
    from runtime.nemo_rl.virtual_cluster import RayVirtualCluster
    from runtime.nemo_rl.worker_groups import RayWorkerBuilder, RayWorkerGroup

    ray.init(address="local", num_cpus=4, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    try:
        batch = BatchedDataDict({"x": torch.ones(args.rows, args.width)})
        bare = [ray.remote(Summer).options(num_cpus=0).remote() for _ in range(3)]
        cluster = RayVirtualCluster([3], use_gpus=False)
        group = RayWorkerGroup(cluster, RayWorkerBuilder("bench.nemo_dispatch.Summer"),
                               sharding_annotations=NamedSharding(layout=[0, 1, 2], names=["dp"]))
        expect = [float(args.rows // 3 * args.width)] * 3

        def call_bare():
            shards = batch.shard_by_batch_size(3)
            return ray.get([a.step.remote(s) for a, s in zip(bare, shards)])

        def call_face():
            shards = batch.shard_by_batch_size(3)
            futures = group.run_all_workers_sharded_data("step", data=shards, in_sharded_axes=["dp"])
            return group.get_all_worker_results(futures)

        assert call_bare() == expect and call_face() == expect, (call_bare(), call_face())
        times = {"bare": [], "face": []}
        for fn in (call_bare, call_face):
            for _ in range(args.warmup):
                fn()
        while len(times["face"]) < args.calls:
            for name, fn in (("bare", call_bare), ("face", call_face)):
                for _ in range(args.block):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(1000 * (time.perf_counter() - t0))
        bare_ms, face_ms = statistics.median(times["bare"]), statistics.median(times["face"])
        mib = args.rows * args.width * 4 / 2**20
        print(f"3 workers, batch {args.rows}x{args.width} float32 ({mib:.2f} MiB), {args.calls} calls each, medians; "
              f"load before {os.getloadavg()[0]:.2f}")
        print(f"  bare Ray actor calls (shard + .remote + ray.get): {bare_ms:.3f} ms")
        print(f"  run_all_workers_sharded_data + get_all_worker_results: {face_ms:.3f} ms "
              f"({face_ms / bare_ms:.2f}x bare, {face_ms - bare_ms:+.3f} ms)")
        group.shutdown(force=True)
        cluster.shutdown()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

"""A NeMo RL worker's actor killed -> the next successful call, with a spare bundle against without, in one run.

Two groups of --workers workers of one class (runtime.nemo_rl's RayWorkerGroup, restart_on_failure=True),
on one local Ray, each on its own RayVirtualCluster:
- spare: RayVirtualCluster([workers + 1]) with workers_per_node=workers: one bundle holds no worker,
  so the dead worker's actor is re-created there (restart_failed_workers takes a spare bundle first);
- own (the baseline): RayVirtualCluster([workers]): the actor is re-created in the dead worker's own
  bundle, once Ray has freed it.
A round kills worker 1's actor with ray.kill (t0), then calls the group as NeMo RL code does
(run_all_workers_sharded_data + get_all_worker_results) until a call returns from the re-created
actor (t2): the first call that reaches the dead actor raises WorkerGroupRestarted once the actor is
re-created (t1); a call made before the kill has landed (it is asynchronous) still returns from the
old one and is simply made again. Printed: medians over
--rounds rounds per side (the sides take turns) of t0 -> t2, t0 -> t1, and a healthy call, and the
spare / own ratio. No thresholds: figures only.
Run: .venv/bin/python bench/nemo_recovery.py [--rounds 10 --workers 2]
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


class Worker:
    """The worker both sides run: its rank and the value it was sent."""

    def step(self, x):
        return int(os.environ["RANK"]), x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="kills per side")
    ap.add_argument("--workers", type=int, default=2, help="workers per group (worker 1 is killed)")
    ap.add_argument("--healthy-calls", type=int, default=50, help="calls timed on the healthy group first")
    args = ap.parse_args()
    import ray

    from runtime.nemo_rl.named_sharding import NamedSharding
    from runtime.nemo_rl.virtual_cluster import RayVirtualCluster
    from runtime.nemo_rl.worker_groups import RayWorkerBuilder, RayWorkerGroup
    from runtime.workers.failures import WorkerGroupRestarted

    n = args.workers
    ray.init(address="local", num_cpus=2 * n + 1, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    sides = {}
    try:
        for name, bundles in (("own", n), ("spare", n + 1)):
            cluster = RayVirtualCluster([bundles], use_gpus=False, name=f"recovery-{name}")
            group = RayWorkerGroup(cluster, RayWorkerBuilder("bench.nemo_recovery.Worker"), name_prefix=name,
                                   workers_per_node=n, sharding_annotations=NamedSharding(list(range(n)), ["dp"]),
                                   restart_on_failure=True, max_restarts=args.rounds)
            sides[name] = (cluster, group)
        expect = [(r, r) for r in range(n)]

        def call(group):
            return group.get_all_worker_results(group.run_all_workers_sharded_data(
                "step", x=list(range(n)), in_sharded_axes=["dp"]))

        healthy = []
        for _ in range(args.healthy_calls):
            t0 = time.perf_counter()
            assert call(sides["own"][1]) == expect
            healthy.append(1000 * (time.perf_counter() - t0))
        times = {name: {"error": [], "next_ok": []} for name in sides}
        load_before = os.getloadavg()[0]
        for _ in range(args.rounds):
            for name, (_, group) in sides.items():
                victim = group.workers[1]
                t0 = time.perf_counter()
                ray.kill(victim, no_restart=True)  # lands asynchronously: a call may still reach the victim
                t1 = None
                while True:
                    try:
                        out = call(group)
                    except WorkerGroupRestarted:
                        t1 = time.perf_counter()
                        continue
                    if group.workers[1] is not victim:
                        break
                t2 = time.perf_counter()
                assert out == expect and t1 is not None
                times[name]["error"].append(t1 - t0)
                times[name]["next_ok"].append(t2 - t0)
        med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
        print(f"{n} workers per group, {args.rounds} kills per side (taking turns), medians; "
              f"load before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
        print(f"  healthy call (sharded_data + get_all_worker_results): {statistics.median(healthy):.2f} ms")
        for name, label in (("own", "own bundle (baseline)"), ("spare", "spare bundle")):
            print(f"  kill -> next successful call, {label}: {med[name]['next_ok']:.3f} s "
                  f"(kill -> WorkerGroupRestarted {med[name]['error']:.3f} s; "
                  f"range {min(times[name]['next_ok']):.3f}-{max(times[name]['next_ok']):.3f} s)")
        print(f"  ratio spare / own: {med['spare']['next_ok'] / med['own']['next_ok']:.2f}")
    finally:  # the groups and clusters made so far, then Ray
        for cluster, group in sides.values():
            group.shutdown(force=True)
            cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()

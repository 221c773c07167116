"""The head's barrier at 100 to 10,000 nodes, without Ray processes: the barrier's own code
(runtime/cluster/ray_agent.py `barrier`) and the node records (runtime/cluster/node_records.py), driven
against an in-process stand-in for what it asks Ray (`ray.nodes()` and the GCS key-value store).

Nodes join at an even pace over --join-s seconds (what Slurm's srun fan-out and each node's Ray start
give); a share of them (--retrying) first write a `retrying` record, as a worker whose Ray start
failed once does. For each N it prints one line:

    N=<n>: rounds, the head's CPU in the barrier (total, per round, per node per round), the KV
    operations it made, the bytes of the records, and the bytes `ray.nodes()` would return per round

The stand-in answers at once, so the CPU is the barrier's own; what Ray's GCS costs per `ray.nodes()`
call is measured on the real Ray by bench/scale.py. A node entry's size is that of a real entry of
this machine's Ray (one `ray.init()`), when Ray is importable.

    python bench/scale_model.py --nodes 100,1000,10000 --join-s 5
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.cluster import node_records  # noqa: E402
from runtime.cluster.identity import NodeIdentity  # noqa: E402


def real_node_entry() -> dict:
    """One entry of a real `ray.nodes()` here (a 1-node Ray), or a minimal one when Ray is missing."""
    try:
        import ray
    except ImportError:
        return {"NodeID": "0" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeManagerHostname": "n1",
                "NodeManagerPort": 20001, "Resources": {"CPU": 2.0}}
    # address="local": a Ray of its own, never one a test or a job left in /tmp/ray/ray_current_cluster
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        return json.loads(json.dumps(ray.nodes()[0], default=str))
    finally:
        ray.shutdown()


class StandIn:
    """`ray` and `ray.experimental.internal_kv` as the barrier calls them; nodes join on a clock."""

    def __init__(self, n: int, join_s: float, retrying: float, template: dict, held_back: tuple[int, ...] = ()):
        self.n, self.join_s, self.t0 = n, join_s, time.monotonic()
        self.held_back = set(held_back)  # ranks that never join (a node that never came up)
        self.kv: dict[bytes, bytes] = {}
        self.ops = {"nodes": 0, "kv_list": 0, "kv_get": 0}
        self.entries = []
        for i in range(n):
            e = dict(template)
            e.update(NodeID=f"{i:056x}", Alive=True, NodeManagerAddress=address(i),
                     NodeManagerHostname=f"node{i:05d}", NodeManagerPort=20001)
            self.entries.append(e)
        self.retry_ranks = set(range(1, n, max(1, round(1 / retrying)))) if retrying > 0 else set()
        self.entry_bytes = len(json.dumps(self.entries[-1]).encode())

    def joined(self) -> int:
        return min(self.n, int(self.n * (time.monotonic() - self.t0) / self.join_s) + 1)

    def nodes(self) -> list:
        self.ops["nodes"] += 1
        k = self.joined()
        joined = [e for i, e in enumerate(self.entries[:k]) if i not in self.held_back]
        for rank in self.retry_ranks:  # a worker that failed once says so before it joins
            if rank >= k and node_records.PREFIX + str(rank).encode() not in self.kv:
                rec = node_records.NodeRecord(rank, f"node{rank:05d}", f"node{rank:05d}", "10.0.0.1", 20001,
                                              node_records.RETRYING, 1, "GCS not reachable yet")
                self.kv[rec.key()] = rec.encode().encode()
        return joined

    def kv_list(self, prefix: bytes):
        self.ops["kv_list"] += 1
        return [k for k in self.kv if k.startswith(prefix)]

    def kv_get(self, key: bytes):
        self.ops["kv_get"] += 1
        return self.kv.get(key)

    def install(self) -> None:
        ray = types.ModuleType("ray")
        ray.nodes = self.nodes
        experimental = types.ModuleType("ray.experimental")
        kv = types.ModuleType("ray.experimental.internal_kv")
        kv._internal_kv_list, kv._internal_kv_get = self.kv_list, self.kv_get
        experimental.internal_kv = kv
        ray.experimental = experimental
        sys.modules.update({"ray": ray, "ray.experimental": experimental, "ray.experimental.internal_kv": kv})


def address(i: int) -> str:
    return f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"


def one(n: int, join_s: float, retrying: float, template: dict, held_back: tuple[int, ...] = (),
        timeout_s: float | None = None) -> dict:
    """The barrier with N nodes joining over join_s (those in held_back never do: then it raises the
    launcher's LaunchError naming them, after timeout_s)."""
    from runtime.cluster import ray_agent
    stand_in = StandIn(n, join_s, retrying, template, held_back)
    stand_in.install()
    ident = NodeIdentity(source="model", node_rank=0, num_nodes=n, head_address=address(0), hostname="node00000",
                         node_addresses=tuple(address(i) for i in range(n)))
    seen = {"calls": 0, "started": set()}

    def on_alive(nodes):  # what the Warmer does per poll: look at every alive node once
        seen["calls"] += 1
        for node in nodes:
            seen["started"].add(node["NodeID"])
    quiet = open(os.devnull, "w")
    stdout, stderr, sys.stdout, sys.stderr = sys.stdout, sys.stderr, quiet, quiet  # its log: a line a retrying node
    try:
        wall0, cpu0 = time.monotonic(), time.process_time()
        ray_agent.barrier(ident, "10.0.0.1:6379", timeout_s=timeout_s or join_s * 4 + 60, on_alive=on_alive)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        quiet.close()
    rounds = stand_in.ops["nodes"]
    record_bytes = sum(len(v) for v in stand_in.kv.values())
    return {"n": n, "rounds": rounds, "wall_s": wall, "cpu_s": cpu, "cpu_ms_per_round": 1000 * cpu / rounds,
            "cpu_us_per_node_round": 1e6 * cpu / rounds / n, "kv_list": stand_in.ops["kv_list"],
            "kv_get": stand_in.ops["kv_get"], "records": len(stand_in.kv), "record_bytes": record_bytes,
            "nodes_bytes_per_round": stand_in.entry_bytes * n, "warmed": len(seen["started"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="100,1000,10000", help="comma-separated node counts")
    ap.add_argument("--join-s", type=float, default=5.0, help="seconds over which the nodes join")
    ap.add_argument("--retrying", type=float, default=0.01, help="share of nodes that write a retrying record first")
    args = ap.parse_args()
    template = real_node_entry()
    print(f"a real ray.nodes() entry here: {len(json.dumps(template).encode())} bytes; nodes join over "
          f"{args.join_s:g} s; {args.retrying:.0%} write a retrying record first; load {os.getloadavg()[0]:.2f}")
    base = None
    for n in [int(x) for x in args.nodes.split(",")]:
        r = one(n, args.join_s, args.retrying, template)
        base = base or r
        print(f"N={n}: {r['rounds']} rounds in {r['wall_s']:.1f} s; head CPU {r['cpu_s']:.3f} s "
              f"({r['cpu_ms_per_round']:.2f} ms a round, {r['cpu_us_per_node_round']:.2f} us a node a round; "
              f"x{r['cpu_ms_per_round'] / base['cpu_ms_per_round']:.1f} the N={base['n']} round for "
              f"x{n / base['n']:.0f} the nodes); KV: {r['kv_list']} lists, {r['kv_get']} gets for {r['records']} "
              f"records ({r['record_bytes']} B); ray.nodes() would return {r['nodes_bytes_per_round'] / 1e6:.2f} MB "
              f"a round; warmed {r['warmed']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

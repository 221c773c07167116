"""HostPool: the one place a worker host (runtime.workers.worker_host) is created, warm, spare or fresh.

A fresh host is started in its rank's placement-group bundle (HostPool.in_bundle). Warm and spare
hosts are processes that have started and imported torch, waiting to take a rank.

A group restart needs new processes for every rank (a torch process group cannot re-admit one);
starting a Ray worker and importing torch is most of a restart's time. With spares, a restart only
joins the process group and builds the user's worker. Spares hold no Ray resources (num_cpus=0,
pinned to a node): a rank taken by a spare runs on its bundle's node while the bundle keeps its
reservation. One spare per rank on the rank's node, plus enough for the largest node's ranks on
each of two more nodes (reserve nodes), so the loss of any one node is covered.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from runtime.workers.worker_host import WorkerHost

# warm hosts the launcher starts while its barrier waits, for the driver's first group to adopt
WARM_NAMESPACE = "raytrain-warm"


def _host_on(node_id: str, label: str, monitor_memory: bool = False, **options):
    """A host pinned to a node, holding no Ray resources, that imports torch (and DDP's imports) as
    it starts."""
    return WorkerHost.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                              **options).remote(label, monitor_memory=monitor_memory, preload_torch=True,
                                                preload_ddp=True)


def warm_up(node_id: str, count: int) -> list:
    """Start `count` named hosts on a node (process start and torch import happen now, in the
    background); RayWorkerGroup adopts them when it starts its ranks there. Keep the handles
    returned: a host lives while its creator holds one (or until its creator's job ends)."""
    return [_host_on(node_id, "warm", name=f"{node_id}-{i}", namespace=WARM_NAMESPACE, get_if_exists=True)
            for i in range(count)]


class HostPool:
    """The spare hosts of one group, by node, and the fresh hosts it starts in its bundles."""

    def __init__(self, monitor_memory: bool = False):
        self.monitor_memory = monitor_memory
        self.by_node: dict[str, list] = {}
        self.reserve_nodes: list[str] = []

    def plan(self, slot_nodes: list[str]) -> dict[str, int]:
        """How many spares each node should hold for a group whose ranks sit on `slot_nodes`."""
        want = Counter(slot_nodes)
        largest = max(want.values(), default=0)
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        # reserves go to nodes without ranks first, then to the ranks' nodes in rank order
        order = [n for n in alive if n not in want] + list(dict.fromkeys(slot_nodes))
        self.reserve_nodes = order[:2]
        for node in self.reserve_nodes:
            want[node] += largest
        return dict(want)

    def reserve_for(self, lost_node: str) -> str:
        """The node a lost node's ranks should move to: a reserve node that is not the lost one."""
        return next((n for n in self.reserve_nodes if n != lost_node and self.count(n)), "")

    def fill(self, slot_nodes: list[str]) -> int:
        """Start the spares that are missing (asynchronously: nothing waits for them). Returns how many."""
        started = 0
        for node, n in self.plan(slot_nodes).items():
            have = self.by_node.setdefault(node, [])
            for _ in range(n - len(have)):
                have.append(_host_on(node, "spare", monitor_memory=self.monitor_memory))
                started += 1
        return started

    def adopt(self, nodes: Iterable[str], timeout_s: float = 30) -> int:
        """Claim the launcher's warm hosts on `nodes` (each goes to one group only); returns how many.
        A host still importing is waited for up to timeout_s; one that does not answer is left."""
        nodes = set(nodes)
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == WARM_NAMESPACE and a["name"].rsplit("-", 1)[0] in nodes]
        hosts = {}
        for name in names:
            try:
                h = ray.get_actor(name, namespace=WARM_NAMESPACE)
            except ValueError:  # gone since it was listed
                continue
            hosts[h.claim.remote()] = (name.rsplit("-", 1)[0], h)
        ready, _ = ray.wait(list(hosts), num_returns=len(hosts), timeout=timeout_s) if hosts else ([], [])
        adopted = 0
        for ref in ready:
            try:
                mine = ray.get(ref, timeout=0)
            except ray.exceptions.RayError:
                continue
            if mine:
                node, h = hosts[ref]
                self.by_node.setdefault(node, []).append(h)
                adopted += 1
        return adopted

    def in_bundle(self, rank: int, slot, num_cpus: float, num_gpus: float, memory: int | None, backend: bool):
        """A fresh host for `rank`, in its placement-group bundle (holding the bundle's share)."""
        opts = dict(scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=slot.placement_group,
                                                                         placement_group_bundle_index=slot.bundle_index),
                    num_cpus=num_cpus, num_gpus=num_gpus)
        if memory:
            opts["memory"] = memory
        # with a process group the host imports torch.distributed before its rank arrives; without, nothing
        return WorkerHost.options(**opts).remote(f"rank{rank}", monitor_memory=self.monitor_memory,
                                                 preload_torch=backend)

    def take(self, node: str):
        """A spare on `node`, or None."""
        have = self.by_node.get(node)
        return have.pop(0) if have else None

    def count(self, node: str | None = None) -> int:
        return len(self.by_node.get(node, [])) if node else sum(len(v) for v in self.by_node.values())

    def drop_node(self, node: str) -> None:
        """Forget (and kill) the spares of a node that is gone."""
        for h in self.by_node.pop(node, []):
            ray.kill(h, no_restart=True)

    def shutdown(self) -> None:
        # a host killed while its worker is still starting can abort in Ray's own teardown
        # (~CoreWorker() -> std::terminate, seen at the end of jobs whose spares had just been forked
        # from the zygote): give them a moment to finish starting, then kill them
        hosts = [h for hs in self.by_node.values() for h in hs]
        if hosts:
            ray.wait([h.__ray_ready__.remote() for h in hosts], num_returns=len(hosts), timeout=5)
        for node in list(self.by_node):
            self.drop_node(node)

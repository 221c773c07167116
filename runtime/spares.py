"""Spare worker hosts: processes that have started and imported torch, waiting to take a rank.

A group restart needs new processes for every rank (a torch process group cannot re-admit one);
starting a Ray worker and importing torch is most of a restart's time. With spares, a restart only
joins the process group and builds the user's worker. Spares hold no Ray resources (num_cpus=0,
pinned to a node): a rank taken by a spare runs on its bundle's node while the bundle keeps its
reservation. One spare per rank on the rank's node, plus enough for the largest node's ranks on
each of two more nodes (reserve nodes), so the loss of any one node is covered.
"""
from __future__ import annotations

from collections import Counter

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.worker_host import WorkerHost


class SparePool:
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
                have.append(WorkerHost.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node, soft=False)).remote("spare", self.monitor_memory))
                started += 1
        return started

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
        for node in list(self.by_node):
            self.drop_node(node)

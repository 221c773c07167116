"""RayVirtualCluster: one STRICT_PACK placement group per physical node, bundles in stable node order."""
from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group


@dataclass(frozen=True)
class BundleSlot:
    """Where one worker goes: a bundle of a node's placement group."""
    placement_group: object
    bundle_index: int
    node_rank: int
    local_rank: int
    node_ip: str
    local_world_size: int


class RayVirtualCluster:
    def __init__(self, bundle_ct_per_node_list: list[int], *, use_gpus: bool = False, num_cpus_per_bundle: float = 1,
                 max_colocated_worker_groups: int = 1, name: str = "raytrain", ready_timeout_s: float = 60):
        if not bundle_ct_per_node_list or any(n < 0 for n in bundle_ct_per_node_list):
            raise ValueError(f"bundle_ct_per_node_list must list non-negative counts, got {bundle_ct_per_node_list}")
        if max_colocated_worker_groups < 1:
            raise ValueError("max_colocated_worker_groups must be >= 1")
        self.use_gpus = use_gpus
        self.num_cpus_per_bundle = num_cpus_per_bundle
        self.max_colocated_worker_groups = max_colocated_worker_groups
        bundle = {"CPU": num_cpus_per_bundle, **({"GPU": 1} if use_gpus else {})}
        pgs = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK", name=f"{name}-node{i}")
               for i, n in enumerate(bundle_ct_per_node_list) if n > 0]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise RuntimeError(
                f"placement groups {bundle_ct_per_node_list} (each bundle {bundle}) were not placed within "
                f"{ready_timeout_s:.0f}s; the cluster has {ray.cluster_resources()}") from None
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        placed = []
        for pg in pgs:
            node_id = placement_group_table(pg)["bundles_to_node_id"][0]
            placed.append((ips.get(node_id, ""), node_id, pg))
        # stable order: by node address, so ranks are grouped by node and reproducible
        self._pgs = [pg for _, _, pg in sorted(placed, key=lambda t: (t[0], t[1]))]
        self._ips = [ip for ip, _, _ in sorted(placed, key=lambda t: (t[0], t[1]))]

    def get_placement_groups(self) -> list:
        return list(self._pgs)

    def slots(self) -> list[BundleSlot]:
        out = []
        for node_rank, (pg, ip) in enumerate(zip(self._pgs, self._ips)):
            n = pg.bundle_count
            out.extend(BundleSlot(pg, i, node_rank, i, ip, n) for i in range(n))
        return out

    @property
    def world_size(self) -> int:
        return sum(pg.bundle_count for pg in self._pgs)

    def shutdown(self) -> None:
        for pg in self._pgs:
            remove_placement_group(pg)
        self._pgs = []

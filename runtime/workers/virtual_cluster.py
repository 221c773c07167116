"""RayVirtualCluster: one STRICT_PACK placement group per physical node, bundles in stable node order.

The seed's (NeMo RL's) options, each with a meaning here:
    enable_colocation      worker groups share the bundles, taking turns (each actor asks for a
                           1/max_colocated_worker_groups share; 2 groups unless said otherwise)
    gpu_ids                pin bundle k of node n to a device: [0, 1] for one node, [[0, 1], [2, 3]]
                           per node, or "auto" (the devices Ray assigns); workers get CUDA_VISIBLE_DEVICES
    communication_backend  "nccl" or "gloo" for torch.distributed; default by device (nccl with GPUs)
    monitor_memory         workers track peak memory per call (RSS, and CUDA's peak where present),
                           reported by RayWorkerGroup.get_resource_usage()
    memory_per_bundle      memory (bytes or "8GB") each bundle reserves, which a worker group's
                           memory_limit draws from
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Optional, Union

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from runtime.errors import InputError

BACKENDS = ("nccl", "gloo")


def parse_bytes(value: Union[int, str, None], what: str) -> Optional[int]:
    """8 * 2**30, "8GB", "8GiB", "512M" -> bytes (the one parser of sizes); InputError (a ValueError)
    naming WHAT for anything else."""
    if value is None or isinstance(value, int):
        return value
    m = re.fullmatch(r" *([0-9]+(?:\.[0-9]+)?) *([KMGT]?)(i?B)? *", str(value), re.I)  # spaces, no line breaks
    if not m:
        raise InputError(f"{what}: {value!r} is not a size such as 8GB, 512MiB or a number of bytes")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


@dataclass(frozen=True)
class BundleSlot:
    """Where one worker goes: a bundle of a node's placement group."""
    placement_group: object
    bundle_index: int
    node_rank: int
    local_rank: int
    node_ip: str
    local_world_size: int
    gpu_id: Optional[int] = None  # pinned device (gpu_ids), None = whatever Ray assigns
    node_id: str = ""             # Ray's node ID of the bundle's node


def gpu_assignment(bundle_ct_per_node_list: list[int], gpu_ids) -> list[list[Optional[int]]]:
    """Per node, the device each bundle is pinned to; checked against the bundle counts."""
    counts = list(bundle_ct_per_node_list)
    if gpu_ids is None or gpu_ids == "auto":
        return [[None] * n for n in counts]
    if isinstance(gpu_ids, str):
        raise ValueError(f'gpu_ids: {gpu_ids!r} is not a list of device indices or "auto"')
    per_node = gpu_ids if gpu_ids and all(isinstance(x, (list, tuple)) for x in gpu_ids) else [gpu_ids]
    if len(per_node) != len(counts):
        raise ValueError(f"gpu_ids: {len(per_node)} node list(s) for {len(counts)} node(s) {counts}; give one list "
                         "per node, e.g. [[0, 1], [0, 1]]")
    for n, (ids, want) in enumerate(zip(per_node, counts)):
        if len(ids) != want or len(set(ids)) != len(ids) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError(f"gpu_ids: node {n} needs {want} distinct device indices, got {list(ids)}")
    return [list(ids) for ids in per_node]


class RayVirtualCluster:
    def __init__(self, bundle_ct_per_node_list: list[int], *, use_gpus: Optional[bool] = None,
                 num_cpus_per_bundle: float = 1, max_colocated_worker_groups: Optional[int] = None,
                 enable_colocation: bool = False, gpu_ids=None, communication_backend: Optional[str] = None,
                 monitor_memory: bool = False, memory_per_bundle: Union[int, str, None] = None,
                 name: str = "raytrain", ready_timeout_s: float = 60, lazy: bool = False):
        if not bundle_ct_per_node_list or any(not isinstance(n, int) or n < 0 for n in bundle_ct_per_node_list):
            raise ValueError(f"bundle_ct_per_node_list must list non-negative counts, got {bundle_ct_per_node_list}")
        if use_gpus is None:
            use_gpus = gpu_ids is not None or communication_backend == "nccl"
        if gpu_ids is not None and not use_gpus:
            raise ValueError("gpu_ids pins bundles to GPUs, but use_gpus=False; drop gpu_ids or set use_gpus=True")
        if communication_backend not in (None, *BACKENDS):
            raise ValueError(f"communication_backend: {communication_backend!r} is not one of {', '.join(BACKENDS)}")
        if communication_backend == "nccl" and not use_gpus:
            raise ValueError('communication_backend="nccl" needs GPUs (use_gpus=True); on CPUs use "gloo"')
        if max_colocated_worker_groups is None:
            max_colocated_worker_groups = 2 if enable_colocation else 1
        if max_colocated_worker_groups < 1:
            raise ValueError("max_colocated_worker_groups must be >= 1")
        self.use_gpus = use_gpus
        self.num_cpus_per_bundle = num_cpus_per_bundle
        self.max_colocated_worker_groups = max_colocated_worker_groups
        self.enable_colocation = max_colocated_worker_groups > 1
        self.communication_backend = communication_backend or ("nccl" if use_gpus else "gloo")
        self.monitor_memory = monitor_memory
        self.memory_per_bundle = parse_bytes(memory_per_bundle, "memory_per_bundle")
        self._gpu_ids = gpu_assignment(bundle_ct_per_node_list, gpu_ids)
        self._gpu_ids = [ids for ids, n in zip(self._gpu_ids, bundle_ct_per_node_list) if n > 0]
        self._bundle = {"CPU": num_cpus_per_bundle, **({"GPU": 1} if use_gpus else {}),
                        **({"memory": self.memory_per_bundle} if self.memory_per_bundle else {})}
        self._counts, self._name, self._ready_timeout_s = list(bundle_ct_per_node_list), name, ready_timeout_s
        # filled by _create_placement_groups, in place (the finalizer holds this very list)
        self._pgs: list = []
        self._ips: list[str] = []
        self._node_ids: list[str] = []
        self._slot_gpus: list = []
        # a cluster that is collected without shutdown() still frees its placement groups (and so its name)
        self._finalizer = weakref.finalize(self, _remove_all, self._pgs)
        if not lazy:
            self._create_placement_groups()

    def _create_placement_groups(self) -> None:
        """One STRICT_PACK group per node with bundles, ready within ready_timeout_s, in stable node order."""
        if self._pgs:
            return
        counts, bundle, name = self._counts, self._bundle, self._name
        pgs = []
        for i, n in enumerate(counts):
            if n == 0:
                continue
            try:
                pgs.append(placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK",
                                           name=f"{name}-node{i}"))
            except ray.exceptions.RaySystemError as e:
                _remove_all(pgs)
                if "already exists" not in str(e):
                    raise
                raise InputError(f"name: {name!r} is taken in this Ray cluster (a placement group {name}-node{i} "
                                 "exists: another RayVirtualCluster of that name was not shut down); call its "
                                 "shutdown() first, or give this one another name=") from None
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self._ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            _remove_all(pgs)
            raise RuntimeError(
                f"placement groups {counts} (each bundle {bundle}) were not placed within "
                f"{self._ready_timeout_s:.0f}s; the cluster has {ray.cluster_resources()}") from None
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        placed = []
        for pg, gpus in zip(pgs, self._gpu_ids):
            node_id = placement_group_table(pg)["bundles_to_node_id"][0]
            placed.append((ips.get(node_id, ""), node_id, pg, gpus))
        # stable order: by node address, so ranks are grouped by node and reproducible
        placed.sort(key=lambda t: (t[0], t[1]))
        self._pgs[:] = [pg for _, _, pg, _ in placed]
        self._ips[:] = [ip for ip, _, _, _ in placed]
        self._node_ids[:] = [node_id for _, node_id, _, _ in placed]
        self._slot_gpus[:] = [gpus for _, _, _, gpus in placed]

    def get_placement_groups(self) -> list:
        self._create_placement_groups()
        return list(self._pgs)

    def slots(self) -> list[BundleSlot]:
        self._create_placement_groups()
        out = []
        for node_rank, (pg, ip, gpus) in enumerate(zip(self._pgs, self._ips, self._slot_gpus)):
            n = pg.bundle_count
            node_id = self._node_ids[node_rank]
            out.extend(BundleSlot(pg, i, node_rank, i, ip, n, gpus[i], node_id) for i in range(n))
        return out

    def move_off(self, lost_node_id: str, prefer_node_id: str = "", timeout_s: float = 5) -> int:
        """Re-place the placement groups of a lost node now, without waiting for Ray to declare the
        node dead (its health checks take seconds) and reschedule them: each goes to `prefer_node_id`
        if it fits there within timeout_s, else to any other node (Ray's choice, within the cluster's
        ready timeout). Returns how many groups moved. Bundles pinned to GPU ids are not moved (the
        ids belong to the lost node); they wait for Ray's own rescheduling."""
        moved = 0
        for i, node_id in enumerate(self._node_ids):
            if node_id != lost_node_id or any(g is not None for g in self._slot_gpus[i]):
                continue
            old = self._pgs[i]
            remove_placement_group(old)
            n = old.bundle_count
            tries = [({"ray.io/node-id": prefer_node_id}, timeout_s)] if prefer_node_id not in ("", lost_node_id) else []
            tries.append(({"ray.io/node-id": f"!{lost_node_id}"}, self._ready_timeout_s))
            pg = None
            for label, wait_s in tries:
                pg = placement_group([dict(self._bundle) for _ in range(n)], strategy="STRICT_PACK",
                                     name=f"{self._name}-node{i}-moved", bundle_label_selector=[label] * n)
                try:
                    ray.get(pg.ready(), timeout=wait_s)
                    break
                except ray.exceptions.GetTimeoutError:
                    remove_placement_group(pg)
                    pg = None
            if pg is None:
                raise RuntimeError(f"the placement group of lost node {lost_node_id[:12]} ({self._ips[i]}) could not "
                                   f"be placed on another node within {self._ready_timeout_s:.0f}s; the cluster has "
                                   f"{ray.available_resources()} available")
            new_id = placement_group_table(pg)["bundles_to_node_id"][0]
            ips = {x["NodeID"]: x["NodeManagerAddress"] for x in ray.nodes()}
            self._pgs[i], self._node_ids[i], self._ips[i] = pg, new_id, ips.get(new_id, "")
            moved += 1
        return moved

    def world_size(self) -> int:
        """Bundles in the cluster (a method, as in NeMo RL)."""
        return sum(self._counts)

    def node_count(self) -> int:
        return sum(1 for n in self._counts if n > 0)

    def get_master_address_and_port(self) -> tuple[str, int]:
        """An address and a free port on the first node (in its first bundle), for torch.distributed."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        self._create_placement_groups()
        return ray.get(_free_port.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self._pgs[0], placement_group_bundle_index=0)).remote())

    def shutdown(self) -> bool:
        """Free the placement groups (also done when the cluster is collected); True when done. A later
        use places new ones, freed the same ways (the finalizer stays armed for them)."""
        _remove_all(self._pgs)
        return True


def _remove_all(pgs: list) -> None:
    """Remove the placement groups in `pgs` and empty it; quiet when Ray is already gone."""
    if pgs and ray.is_initialized():
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
    pgs.clear()


@ray.remote(num_cpus=0)
def _free_port() -> tuple[str, int]:
    from runtime.workers import free_ports
    return ray.util.get_node_ip_address(), free_ports.any_port()

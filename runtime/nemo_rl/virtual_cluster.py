"""NeMo RL's RayVirtualCluster (nemo_rl.distributed.virtual_cluster) over runtime.workers.virtual_cluster.

The placement groups are the core's: one STRICT_PACK group per node, bundles in stable node order
(runtime.workers.virtual_cluster.RayVirtualCluster, of which this is a lazy subclass). This class maps NeMo
RL's constructor onto it and adds NeMo RL's behaviour around it:

- nothing is placed until a placement group is needed (`get_placement_groups()`, a worker group,
  `get_master_address_and_port()`, or `_init_placement_groups()` directly);
- `_init_placement_groups` checks the cluster's totals first and retries a shortfall
  (ResourceInsufficientError) NRL_VIRTUAL_CLUSTER_MAX_RETRIES times (default 6), sleeping 1, 2, 4, ...
  seconds; a group that is not placed within 180 s raises TimeoutError;
- each bundle holds `max_colocated_worker_groups` CPUs and, with use_gpus, one GPU;
- master and worker ports come from [port_range_low, port_range_high) (1400-1999 unless given),
  below the kernel's ephemeral range; a cluster never hands out the same master port twice;
- the placement groups are freed by `shutdown()` or, failing that, when the cluster is garbage
  collected (the core's finalizer), so a later cluster of the same name can be placed.

Not provided here (no meaning on this runtime): unified cross-node placement groups
(`use_unified_pg=True`), NVLink-domain topology ordering (`segment_size`,
`node_resource_constraints`), the vLLM / SGLang / Gym / Dynamo port bands, and uv-built per-actor
virtual environments (see PY_EXECUTABLES). Asking for one of the first two raises
NotImplementedError rather than silently doing something else.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime import numbers
from runtime.errors import InputError
from runtime.workers import free_ports
from runtime.workers.virtual_cluster import RayVirtualCluster as _CoreCluster

logger = logging.getLogger(__name__)

__all__ = ["RayVirtualCluster", "ResourceInsufficientError", "PY_EXECUTABLES", "init_ray",
           "DEFAULT_MASTER_PORT_RANGE_LOW", "DEFAULT_MASTER_PORT_RANGE_HIGH",
           "DEFAULT_GENERATION_PORT_RANGE_LOW", "DEFAULT_GENERATION_PORT_RANGE_HIGH",
           "DEFAULT_GYM_PORT_RANGE_LOW", "DEFAULT_GYM_PORT_RANGE_HIGH",
           "DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW", "DEFAULT_DYNAMO_CONTROL_PORT_RANGE_HIGH",
           "DEFAULT_DYNAMO_HTTP_PORT_RANGE_LOW", "DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH",
           "DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW", "DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_HIGH",
           "DEFAULT_VLLM_PORT_RANGE_LOW", "DEFAULT_VLLM_PORTS_PER_ENGINE",
           "DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW", "DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH",
           "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW", "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH"]

# NeMo RL's port bands, the same values, so code that picks its ports from them runs unchanged. All lie
# below the Ray ports the launcher pins (runtime.contract, 20000+) and below any ephemeral range.
# Master address / TCPStore ports, half-open [LOW, HIGH)
DEFAULT_MASTER_PORT_RANGE_LOW = 1400
DEFAULT_MASTER_PORT_RANGE_HIGH = 1999
DEFAULT_GENERATION_PORT_RANGE_LOW = 3000    # generation servers
DEFAULT_GENERATION_PORT_RANGE_HIGH = 4999
DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW = 1313
DEFAULT_DYNAMO_CONTROL_PORT_RANGE_HIGH = 1400
DEFAULT_DYNAMO_HTTP_PORT_RANGE_LOW = 3000
DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH = 4000
DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW = 4000
DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_HIGH = 4100
DEFAULT_GYM_PORT_RANGE_LOW = 5000           # environment servers
DEFAULT_GYM_PORT_RANGE_HIGH = 5999
DEFAULT_VLLM_PORT_RANGE_LOW = 7000          # engine i rendezvous at LOW + i * PORTS_PER_ENGINE
DEFAULT_VLLM_PORTS_PER_ENGINE = 100
DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW = 8600  # inside the vLLM band: one rollout backend runs at a time
DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH = 8799
DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW = 8800
DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH = 8999

PLACEMENT_TIMEOUT_S = 180
MAX_RETRIES_ENV = "NRL_VIRTUAL_CLUSTER_MAX_RETRIES"
# Ray's own variables, which a worker must not inherit from the driver
RAY_PRIVATE_ENV = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "RAY_CLIENT_MODE", "RAY_JOB_ID", "RAY_LD_PRELOAD",
                   "RAY_RAYLET_PID", "RAY_USAGE_STATS_ENABLED")


class PY_EXECUTABLES:
    """The interpreters NeMo RL's actors run on.

    NeMo RL builds a uv virtual environment per actor kind (vLLM, Megatron, FSDP, ...) and names
    each by a `uv run --extra ...` command. This runtime has no per-actor environments: every node
    runs the image's one interpreter, with everything the image installs. So every name here is that
    interpreter (`sys.executable`); code that registers an actor under, say, PY_EXECUTABLES.VLLM
    keeps working and the actor runs where every other actor runs.
    """
    SYSTEM = sys.executable
    BASE = SYSTEM
    VLLM = SYSTEM
    FSDP = SYSTEM
    AUTOMODEL = SYSTEM
    MCORE = SYSTEM
    NEMO_GYM = SYSTEM
    SGLANG = SYSTEM
    TRTLLM = SYSTEM


class ResourceInsufficientError(Exception):
    """The Ray cluster has fewer CPUs or GPUs in total than the virtual cluster asks for."""


# -- ports -------------------------------------------------------------------------------------------
def _bind_socket_in_range(sock: socket.socket, port_range_low: int, port_range_high: int,
                          max_retries: Optional[int] = 50, excluded_ports: Optional[set] = None) -> int:
    """Bind `sock` to a port in [low, high) and return it (runtime.workers.free_ports.bind_in_range)."""
    return free_ports.bind_in_range(sock, port_range_low, port_range_high, max_retries, excluded_ports)


def _get_free_port_local(port_range_low: int = DEFAULT_MASTER_PORT_RANGE_LOW,
                         port_range_high: int = DEFAULT_MASTER_PORT_RANGE_HIGH, *,
                         max_retries: Optional[int] = 50, excluded_ports: Optional[set] = None) -> int:
    """A port in [low, high) that this host could bind just now (bound, listened on, released)."""
    return free_ports.port_in_range(port_range_low, port_range_high, max_retries=max_retries,
                                    excluded=excluded_ports)


def _get_free_consecutive_ports_local(port_range_low: int, port_range_high: int, consecutive: int = 1,
                                      start_port: Optional[int] = None) -> int:
    """The base of CONSECUTIVE contiguous ports in [low, high) bindable now, scanning up from START_PORT
    (clamped to low: a per-node cursor, so successive blocks do not overlap); RuntimeError when the range
    has none. A non-positive count is an AssertionError, as NeMo RL raises it."""
    if consecutive < 1:
        raise AssertionError(f"consecutive must be >= 1, got {consecutive}")
    return free_ports.consecutive_ports(port_range_low, port_range_high, consecutive, start_port)


@ray.remote
def _get_node_ip_and_free_port(port_range_low: int = DEFAULT_MASTER_PORT_RANGE_LOW,
                               port_range_high: int = DEFAULT_MASTER_PORT_RANGE_HIGH) -> tuple[str, int]:
    """(this node's IP, a free port in [low, high) on it), run where the caller schedules it."""
    return ray.util.get_node_ip_address(), _get_free_port_local(port_range_low, port_range_high)


# -- the cluster -------------------------------------------------------------------------------------------
class RayVirtualCluster(_CoreCluster):
    """NeMo RL's virtual cluster: `bundle_ct_per_node_list[i]` bundles on node i, each with
    `max_colocated_worker_groups` CPUs (and a GPU when use_gpus), placed on first use.

    A runtime.workers.virtual_cluster.RayVirtualCluster (created lazy), so the core's own worker group and
    slots() take it too; every first use, the core's included, goes through NeMo RL's checks and
    retries. `num_gpus_per_node` is passed on to the workers' configure_worker hook;
    `placement_group_strategy` is kept for NeMo RL's unified placement group, which is not provided
    (per-node groups are packed, as in NeMo RL, and strictly: a node's bundles share its node)."""

    def __init__(self, bundle_ct_per_node_list: list[int], use_gpus: bool = True, max_colocated_worker_groups: int = 1,
                 num_gpus_per_node: int = 8, name: str = "", placement_group_strategy: Optional[str] = "SPREAD",
                 port_range_low: Optional[int] = None, port_range_high: Optional[int] = None,
                 segment_size: Optional[int] = None, node_resource_constraints: Optional[list[dict]] = None):
        if segment_size is not None or node_resource_constraints is not None:
            raise NotImplementedError(
                "segment_size / node_resource_constraints pin nodes to NVLink domains that NeMo RL's ray.sub "
                "registers as Ray resources; this runtime registers none, so both must be None")
        use_gpus = numbers.boolean(use_gpus, "use_gpus")
        if use_gpus and num_gpus_per_node <= 0:
            raise ValueError("num_gpus_per_node must be greater than 0 if using GPUs")
        super().__init__(list(bundle_ct_per_node_list), use_gpus=use_gpus,
                         num_cpus_per_bundle=max_colocated_worker_groups,
                         max_colocated_worker_groups=max_colocated_worker_groups, name=name,
                         ready_timeout_s=PLACEMENT_TIMEOUT_S, lazy=True)
        self.num_gpus_per_node = num_gpus_per_node
        self.name = name
        self.placement_group_strategy = placement_group_strategy
        self.port_range_low = DEFAULT_MASTER_PORT_RANGE_LOW if port_range_low is None else \
            numbers.integer(port_range_low, "port_range_low", 1, free_ports.PORT_MAX)
        self.port_range_high = DEFAULT_MASTER_PORT_RANGE_HIGH if port_range_high is None else \
            numbers.integer(port_range_high, "port_range_high", 1, free_ports.PORT_MAX + 1)
        if not self.port_range_low < self.port_range_high:
            raise ValueError(f"port range [{self.port_range_low}, {self.port_range_high}) is empty")
        self.segment_size = None
        self.node_resource_constraints = None
        self._allocated_master_ports: set[int] = set()
        self._sorted_bundle_indices: Optional[list[int]] = None  # only unified groups are reordered in NeMo RL

    # -- placement ----------------------------------------------------------------------------------
    def _create_placement_groups(self) -> None:
        """The core's first-use hook: placed through NeMo RL's checks and retries."""
        if not self._pgs:
            self._init_placement_groups()

    def _init_placement_groups(self, strategy: Optional[str] = None, use_unified_pg: bool = False) -> list:
        """Place the groups (once; later calls return them), retrying a shortfall with backoff."""
        if self._pgs:
            return list(self._pgs)
        strategy = strategy or self.placement_group_strategy
        raw = os.environ.get(MAX_RETRIES_ENV, "6")
        if not (raw.isascii() and raw.isdigit()):  # NeMo RL's tests: a ValueError for a non-integer
            raise InputError(f"{MAX_RETRIES_ENV}={raw[:40]!r} is not a whole number; give an integer from 1 to 20")
        if not 0 < int(raw) <= 20:  # ... and an AssertionError for one out of range
            raise AssertionError(f"{MAX_RETRIES_ENV}={raw[:40]!r} must be an integer greater than 0 (at most 20: "
                                 "the waits between attempts double)")
        max_retries = int(raw)
        for attempt in range(max_retries):
            try:
                return self._create_placement_groups_internal(strategy, use_unified_pg)
            except ResourceInsufficientError as e:
                logger.warning("%s; placement attempt %d/%d, next in %d s", e, attempt + 1, max_retries, 2 ** attempt)
                time.sleep(2 ** attempt)
        raise ResourceInsufficientError(
            f"Maximum number of retries reached ({max_retries}): the Ray cluster ({ray.cluster_resources()}) is too "
            f"small for {self._counts} bundles (use_gpus={self.use_gpus}, "
            f"{self.max_colocated_worker_groups} CPU(s) per bundle), or it is unstable")

    def _create_placement_groups_internal(self, strategy: Optional[str], use_unified_pg: bool = False) -> list:
        """One attempt: check the cluster's totals, then let the core place one group per node."""
        if use_unified_pg:
            raise NotImplementedError(
                "use_unified_pg: one placement group spanning nodes is not provided; the core places one group "
                "per node (runtime.workers.virtual_cluster), which is what use_unified_pg=False gives")
        have = ray.cluster_resources()
        bundles = sum(self._counts)
        if self.use_gpus and bundles > int(have.get("GPU", 0)):
            raise ResourceInsufficientError(
                f"Not enough GPUs available. Requested {bundles} GPUs, but only {int(have.get('GPU', 0))} are "
                "available in the cluster.")
        cpus = bundles * self.max_colocated_worker_groups
        if cpus > int(have.get("CPU", 0)):
            raise ResourceInsufficientError(
                f"Not enough CPUs available. Requested {cpus} CPUs, but only {int(have.get('CPU', 0))} are "
                "available in the cluster.")
        try:
            super()._create_placement_groups()
        except RuntimeError as e:  # the core's "not placed within ready_timeout_s"
            raise TimeoutError(f"Timed out waiting for placement groups to be ready: {e}") from e
        return list(self._pgs)

    def get_placement_groups(self) -> list:
        """The per-node placement groups in node order, placed now if they are not yet."""
        self._create_placement_groups()
        return [pg for pg in self._pgs if pg.bundle_specs]

    # -- addresses ----------------------------------------------------------------------------------
    def get_available_address_and_port(self, pg_idx: int, bundle_idx: int) -> tuple[str, int]:
        """The IP of the node holding bundle `bundle_idx` of group `pg_idx`, and a port free there."""
        return self.get_available_addresses_and_ports_batch([(pg_idx, bundle_idx)])[0]

    def get_available_addresses_and_ports_batch(self, pg_bundle_pairs: list[tuple[int, int]],
                                                batch_size: int = 256) -> list[tuple[str, int]]:
        """get_available_address_and_port for many bundles at once, in the order asked; results are
        fetched `batch_size` at a time."""
        groups = self.get_placement_groups()
        refs = []
        for pg_idx, bundle_idx in pg_bundle_pairs:
            pg = groups[0] if len(groups) == 1 else groups[pg_idx]
            refs.append(_get_node_ip_and_free_port.options(
                num_cpus=0,  # runs even while the bundle's CPUs are taken
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                     placement_group_bundle_index=bundle_idx),
            ).remote(port_range_low=self.port_range_low, port_range_high=self.port_range_high))
        out: dict = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=min(batch_size, len(pending)))
            out.update(zip(ready, ray.get(ready)))
        return [out[r] for r in refs]

    def get_master_address_and_port(self) -> tuple[str, int]:
        """An address and port for torch.distributed's rendezvous, on the first bundle's node, from
        [port_range_low, port_range_high); never a port this cluster handed out before (several
        worker groups may share the cluster)."""
        for _ in range(10):
            addr, port = self.get_available_address_and_port(0, 0)
            if port not in self._allocated_master_ports:
                self._allocated_master_ports.add(port)
                return addr, port
        raise RuntimeError(f"Failed to find a unique master port after 10 retries. Already allocated ports: "
                           f"{sorted(self._allocated_master_ports)}")

    # -- teardown -----------------------------------------------------------------------------------
    def shutdown(self) -> bool:
        """Remove the placement groups (idempotent; also done when the cluster is garbage-collected).
        A later use places new ones, as in NeMo RL, and those are freed the same way."""
        super().shutdown()
        self._sorted_bundle_indices = None
        return True


def init_ray(log_dir: Optional[str] = None) -> None:
    """Connect this driver to Ray, as NeMo RL's init_ray does.

    On this runtime the launcher starts the cluster and hands the driver RAY_ADDRESS, so this attaches
    to it. Without a running cluster a local one is started, tagged with the driver's
    CUDA_VISIBLE_DEVICES (resource `nrl_tag_<devices>`); a later driver reuses a tagged local cluster
    only if the tag matches its own devices, and starts a fresh one otherwise. The driver's
    environment (minus Ray's own variables) is the job's environment, as in NeMo RL."""
    env_vars = {k: v for k, v in os.environ.items() if k != "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"}
    runtime_env = {"env_vars": env_vars}
    devices = ",".join(sorted(os.environ.get("CUDA_VISIBLE_DEVICES", "ALL").split(",")))
    tag = "nrl_tag_" + devices.replace(",", "_")
    temp_dir = os.path.abspath(log_dir) if log_dir else None
    try:
        ray.init(address="auto", log_to_driver=True, include_dashboard=False, runtime_env=runtime_env,
                 _temp_dir=temp_dir)
        have = ray.cluster_resources()
        if not any(k.startswith("nrl_tag_") for k in have) or tag in have:
            logger.info("connected to the Ray cluster: %s", have)  # launched cluster, or our own local one
            return
        logger.info("the local Ray cluster was started for other devices (%s); starting one for %s",
                    [k for k in have if k.startswith("nrl_tag_")], tag)
        ray.shutdown()
    except ConnectionError:
        ray.shutdown()
    # the dashboard only where its packages are installed (a minimal Ray has none)
    ray.init(log_to_driver=True, runtime_env=runtime_env, _temp_dir=temp_dir, resources={tag: 1})

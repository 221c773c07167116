"""NeMo RL's worker groups (nemo_rl.distributed.worker_groups) on this runtime.

`RayWorkerGroup.workers` are the user's own actors (`w.method.remote(...)` works), one per bundle of
a runtime.nemo_rl RayVirtualCluster (the core's placement groups and slots), each started with
runtime.workers.rank_env's rank environment. The calls return ObjectRefs, or a MultiWorkerFuture for
sharded calls, for the caller to `ray.get` (or get_all_worker_results).

A worker's environment, lowest precedence first (as in NeMo RL):
    the class's @ray.remote runtime_env env_vars
    < the driver's os.environ (minus Ray's own variables)
    < the group's env_vars
    < the rank variables: rank_env (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
      MASTER_ADDR, MASTER_PORT, NODE_IP) and NeMo RL's AVAILABLE_ADDR_LIST / AVAILABLE_PORT_LIST
    < what the class's configure_worker returns.

Calls take their data by keyword, as NeMo RL's do: positional data raises AssertionError (NeMo RL
rejects it because Ray mishandled positional arguments in some signatures, NVIDIA-NeMo/RL#582).

Recovery is opt-in (restart_on_failure=True, max_restarts=N; NeMo RL's default, none, is kept): a call
whose worker's actor is gone raises WorkerActorGone naming the worker, its node and the cause (a
WorkerFailureError, and still the RayActorError NeMo RL's callers catch); with restarts the dead actor
is started again first (in a spare bundle of the cluster where there is one, else its own) and the
error is WorkerGroupRestarted. The actor's state is the caller's to restore. The workers, their
liveness check, their replacement and the restarts left are the group core's
(runtime.workers.members), as for the worker half's group: this module adds NeMo RL's call forms,
option names and the spare-bundle choice.

As in NeMo RL, the worker class is imported and its actors started by one IsolatedWorkerInitializer
actor per node (`_initializer_pool`), not by the driver. Not provided: nsight profiling options
(NRL_NSYS_*; no Nsight Systems here).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Union

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime import numbers
from runtime.nemo_rl.named_sharding import NamedSharding
from runtime.nemo_rl.ray_actor_environment_registry import get_actor_python_env
from runtime.nemo_rl.virtual_cluster import RAY_PRIVATE_ENV, RayVirtualCluster
from runtime.workers.failures import WorkerFailureError, WorkerGroupRestarted, death_cause
from runtime.workers.members import GroupOfMembers, Members
from runtime.workers.rank_env import rank_env
from runtime.workers.transfer import per_worker

__all__ = ["MultiWorkerFuture", "RayWorkerBuilder", "RayWorkerGroup"]


def _keywords_only(args: tuple, call: str) -> None:
    if args:
        raise AssertionError(f"{call}: pass the data by keyword (method=..., name=value); positional arguments are "
                             "rejected as in NeMo RL (NVIDIA-NeMo/RL#582)")


def _merged(base: Optional[dict], override: Optional[dict]) -> dict:
    """A new dict: `override` over `base`, nested dicts merged the same way."""
    out = {k: (_merged(v, None) if isinstance(v, dict) else v) for k, v in (base or {}).items()}
    for k, v in (override or {}).items():
        out[k] = _merged(out.get(k) if isinstance(out.get(k), dict) else None, v) if isinstance(v, dict) else v
    return out


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class WorkerActorGone(WorkerFailureError, ray.exceptions.RayActorError):
    """A worker's actor is gone: the project's WorkerFailureError naming the worker, its node and the
    cause, and still the RayActorError that NeMo RL's own code catches, so a caller written for NeMo RL
    behaves as it did (its default: nothing restarts)."""

    def __init__(self, message: str, rank: Optional[int] = None, node: Optional[str] = None):
        WorkerFailureError.__init__(self, message, rank=rank, node=node)
        ray.exceptions.RayActorError.__init__(self, error_msg=message)

    def __str__(self) -> str:
        return self.error_msg


@dataclass
class MultiWorkerFuture:
    """The ObjectRefs of one call on several workers: `called_workers[i]` is the worker that
    `futures[i]` runs on, and `return_from_workers` the workers whose results count (the others
    repeat them, or got dummy calls)."""
    futures: list
    return_from_workers: Optional[list[int]] = None
    called_workers: Optional[list[int]] = None

    def _keep(self, per_future: list) -> list:
        """The items (one per future) of the workers in return_from_workers, in that order."""
        if self.return_from_workers is None:
            return list(per_future)
        if self.called_workers is None:  # futures are indexed by worker
            return [per_future[w] for w in self.return_from_workers if w < len(per_future)]
        position = {w: i for i, w in enumerate(self.called_workers)}
        return [per_future[position[w]] for w in self.return_from_workers
                if w in position and position[w] < len(per_future)]

    def get_results(self, worker_group: "RayWorkerGroup" = None, return_generators_as_proxies: bool = False) -> list:
        """The results, one per worker in return_from_workers. A streaming call (a future that is an
        ObjectRefGenerator) yields every chunk of every worker, in order; with
        return_generators_as_proxies the generators themselves come back, unconsumed."""
        if return_generators_as_proxies:
            return self._keep(self.futures)
        refs, streamed = [], False
        for fut in self.futures:
            if isinstance(fut, ray.ObjectRefGenerator):
                refs.extend(fut)
                streamed = True
            else:
                refs.append(fut)
        try:
            results = ray.get(refs)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            if streamed:
                raise
            failure = self._failed_worker(e, worker_group)
            if worker_group is not None and worker_group.restart_on_failure:
                restarted = worker_group.restart_failed_workers()  # past max_restarts: raises, saying so
                raise WorkerGroupRestarted(f"{failure}; restarted worker(s) {restarted} (restart "
                                           f"{worker_group.restarts} of {worker_group.max_restarts}): call again",
                                           rank=failure.rank, node=failure.node) from e
            raise failure from e
        return results if streamed else self._keep(results)

    def _failed_worker(self, err: BaseException, group: Optional["RayWorkerGroup"]) -> "WorkerActorGone":
        """Which worker's actor is gone behind ERR: its index, name and node, and the cause."""
        for position, ref in enumerate(self.futures):
            try:
                ray.get(ref, timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                worker = self.called_workers[position] if self.called_workers is not None else position
                meta = group.worker_metadata[worker] if group is not None and worker < len(group.worker_metadata) else {}
                node = _node_of(e)
                where = f"{meta.get('name', '')}, node {meta['node_idx']}" if meta else "its node"
                return WorkerActorGone(f"worker {worker} ({where}{f', {node}' if node else ''}) is gone: "
                                       f"{death_cause(e)}: {str(e).strip().splitlines()[0][:300]}",
                                       rank=worker, node=node or (str(meta["node_idx"]) if meta else None))
            except Exception:  # noqa: BLE001 - this one answered (or failed in the user's code)
                continue
        return WorkerActorGone(f"a worker's actor is gone: {death_cause(err)}: {str(err).strip().splitlines()[0][:300]}")


def _node_of(err: BaseException) -> Optional[str]:
    """The node address Ray's error names (`ip: 10.0.0.2`, `node ... (ip ...)`), if any."""
    import re
    m = re.search(r"\bip:? ?([0-9]{1,3}(?:\.[0-9]{1,3}){3})", str(err))
    return m.group(1) if m else None


def _import_class(fqn: str):
    """The class `fqn` names, as a Ray ActorClass (a plain class is wrapped)."""
    module_name, _, class_name = fqn.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"RayWorkerBuilder: cannot import {fqn}: {e}") from e
    if isinstance(cls, ray.actor.ActorClass):
        return cls
    if not isinstance(cls, type):
        raise TypeError(f"{fqn} is not a class")
    return ray.remote(cls)


def _configure(cls, fqn: str, num_gpus, bundle_indices, num_gpus_per_node) -> tuple[dict, dict, dict, dict]:
    """What the class's configure_worker hook asks for: (resources, env_vars, init_kwargs, runtime_env
    overrides); a hook without num_gpus_per_node, or returning three values, is accepted."""
    hook = getattr(cls, "configure_worker", None)
    if hook is None:
        return {}, {}, {}, {}
    kw = {"num_gpus": num_gpus, "bundle_indices": bundle_indices}
    if _accepts(hook, "num_gpus_per_node"):
        kw["num_gpus_per_node"] = num_gpus_per_node
    out = tuple(hook(**kw))
    if len(out) not in (3, 4):
        raise ValueError(f"{fqn}.configure_worker must return (resources, env_vars, init_kwargs"
                         f"[, runtime_env_overrides]), got {len(out)} values")
    resources, env_vars, init_kwargs, overrides = (*out, {}) if len(out) == 3 else out
    return resources or {}, env_vars or {}, init_kwargs or {}, overrides or {}


def _start_worker(fqn: str, init_args: tuple, init_kwargs: dict, placement_group, bundle_index: int, num_gpus,
                  bundle_indices, num_gpus_per_node, extra_options: dict):
    """Import the class and start one actor in the bundle. Options, lowest precedence first: the
    class's @ray.remote options, extra_options, configure_worker's, and the bundle and num_gpus."""
    cls = _import_class(fqn)
    options = _merged(dict(getattr(cls, "_default_options", None) or {}), extra_options)
    resources, env_vars, more_kwargs, overrides = _configure(cls, fqn, num_gpus, bundle_indices, num_gpus_per_node)
    if "num_gpus" in resources:
        num_gpus = resources["num_gpus"]
    if env_vars:
        runtime_env = options.setdefault("runtime_env", {})
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env_vars}
    if overrides:
        options["runtime_env"] = _merged(options.get("runtime_env"), overrides)
    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
        placement_group=placement_group, placement_group_bundle_index=bundle_index,
        placement_group_capture_child_tasks=True)
    options["num_gpus"] = num_gpus
    return cls.options(**options).remote(*init_args, **{**init_kwargs, **more_kwargs})


@dataclass
class _WorkerStart:
    """How one worker of a group was started, to start it again: the index of its placement group in
    the cluster, whether it is one of a tied group's workers, and create_worker's keyword arguments
    (placement_group, placement_group_bundle_index, num_gpus, bundle_indices, num_gpus_per_node,
    runtime_env, name)."""
    pg_idx: int
    tied: bool
    options: dict

    @property
    def bundle(self) -> tuple:
        return self.options["placement_group"].id, self.options["placement_group_bundle_index"]


class RayWorkerBuilder:
    """Makes worker actors of one class: `RayWorkerBuilder("pkg.mod.Class", *init_args, **init_kwargs)`.

    The class may be plain or a @ray.remote ActorClass. It is imported where the workers are started,
    in an IsolatedWorkerInitializer actor, not in the driver (as in NeMo RL, where that actor also
    runs in the worker's own uv environment; here it keeps the worker's imports, e.g. an inference
    engine, out of the driver process). A worker's options, lowest precedence first: the @ray.remote
    options, the caller's `extra_options` (a group passes runtime_env and name), what the class's
    `configure_worker(num_gpus, bundle_indices[, num_gpus_per_node])` returns (resources
    {"num_gpus": ...}, env_vars, init kwargs[, runtime_env overrides]), and the builder's own: the
    placement group bundle and num_gpus. A worker is owned by its initializer and lives as long as
    it does."""

    @ray.remote(num_cpus=0)
    class IsolatedWorkerInitializer:
        def __init__(self, ray_actor_class_fqn: str, *init_args, **init_kwargs):
            self.ray_actor_class_fqn = ray_actor_class_fqn
            self.init_args, self.init_kwargs = init_args, init_kwargs

        def create_worker(self, placement_group, placement_group_bundle_index: int, num_gpus,
                          bundle_indices: Optional[tuple] = None, num_gpus_per_node: Optional[int] = None,
                          **extra_options):
            return _start_worker(self.ray_actor_class_fqn, self.init_args, self.init_kwargs, placement_group,
                                 placement_group_bundle_index, num_gpus, bundle_indices, num_gpus_per_node,
                                 extra_options)

    def __init__(self, ray_actor_class_fqn: str, *args, **kwargs):
        if not isinstance(ray_actor_class_fqn, str) or "." not in ray_actor_class_fqn:
            raise TypeError(f"RayWorkerBuilder needs the class's fully qualified name ('package.module.Class'), "
                            f"got {ray_actor_class_fqn!r}")
        self.ray_actor_class_fqn = ray_actor_class_fqn
        self.args = args
        self.kwargs = kwargs

    def initializer(self, runtime_env: Optional[dict] = None):
        """A new IsolatedWorkerInitializer for this class (no CPU of its own)."""
        return self.IsolatedWorkerInitializer.options(runtime_env=runtime_env or {}).remote(
            self.ray_actor_class_fqn, *self.args, **self.kwargs)

    def create_worker_async(self, placement_group, placement_group_bundle_index: int, num_gpus: Union[float, int],
                            bundle_indices: Optional[tuple[int, list[int]]] = None, **extra_options: Any):
        """(ObjectRef of the worker's handle, its initializer): start one worker without waiting.
        The initializer runs in extra_options' runtime_env; keep it alive as long as the worker."""
        initializer = self.initializer(extra_options.get("runtime_env"))
        return initializer.create_worker.remote(placement_group=placement_group,
                                                placement_group_bundle_index=placement_group_bundle_index,
                                                num_gpus=num_gpus, bundle_indices=bundle_indices,
                                                **extra_options), initializer

    def __call__(self, placement_group, placement_group_bundle_index: int, num_gpus: Union[float, int],
                 bundle_indices: Optional[tuple[int, list[int]]] = None, **extra_options: Any):
        """Start one worker in bundle `placement_group_bundle_index` of `placement_group` and return its
        handle once the actor is submitted (its __init__ runs on; a failure there surfaces at the first
        call). The handle holds its initializer (attribute _RAY_INITIALIZER_ACTOR_REF_TO_AVOID_GC)."""
        ref, initializer = self.create_worker_async(placement_group, placement_group_bundle_index, num_gpus,
                                                    bundle_indices, **extra_options)
        worker = ray.get(ref)
        worker._RAY_INITIALIZER_ACTOR_REF_TO_AVOID_GC = initializer
        return worker


class RayWorkerGroup(GroupOfMembers):
    """Workers of one class in a RayVirtualCluster's bundles.

    workers_per_node: None = one per bundle; an int, or a list (one count per placement group).
    bundle_indices_list: [(pg_idx, [bundle, ...]), ...] instead: each tuple is one tied group (e.g.
    the ranks of one model-parallel engine); its first worker leads it (gets `bundle_indices` in
    configure_worker, counts as one data-parallel shard). sharding_annotations: a NamedSharding over
    the worker indices, for run_rank_0_only_axes and run_all_workers_sharded_data."""

    def __init__(self, cluster: RayVirtualCluster, remote_worker_builder: RayWorkerBuilder,
                 workers_per_node: Optional[Union[int, list[int]]] = None, name_prefix: str = "",
                 bundle_indices_list: Optional[list[tuple[int, list[int]]]] = None,
                 sharding_annotations: Optional[NamedSharding] = None, env_vars: Optional[dict[str, str]] = None,
                 restart_on_failure: bool = False, max_restarts: int = 0):
        if not isinstance(restart_on_failure, bool):
            raise TypeError(f"restart_on_failure must be True or False, got {restart_on_failure!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}")
        self.restart_on_failure, self.max_restarts = restart_on_failure, max_restarts
        self._builder = remote_worker_builder
        self._starts: list[_WorkerStart] = []  # per worker: how it was started, to start it again
        self._init_env: dict = {}
        # the workers (runtime.workers.members, the core the worker half's group keeps its ranks in too):
        # started from _starts by their node's initializer, checked for liveness, replaced, restarts counted
        self.members = Members(self._start_worker, self._worker_nodes, restart_on_failure=restart_on_failure,
                               max_restarts=max_restarts)
        self._worker_metadata: list[dict[str, Any]] = []
        self._initializer_pool: dict[int, Any] = {}  # pg_idx -> IsolatedWorkerInitializer
        self.cluster = cluster
        self.name_prefix = name_prefix
        self.sharding_annotations = sharding_annotations
        self.dp_leader_worker_indices: list[int] = []
        if bundle_indices_list is None:
            bundle_indices_list = self._one_per_bundle(workers_per_node)
        self._create_workers_from_bundle_indices(remote_worker_builder, bundle_indices_list,
                                                 env_vars=dict(env_vars or {}))

    def _one_per_bundle(self, workers_per_node) -> list[tuple[int, list[int]]]:
        groups = self.cluster.get_placement_groups()
        if workers_per_node is None:
            counts = [pg.bundle_count for pg in groups]
        elif isinstance(workers_per_node, int):
            counts = [workers_per_node] * len(groups)
        elif isinstance(workers_per_node, list):
            if len(workers_per_node) != len(groups):
                raise ValueError(f"workers_per_node list length ({len(workers_per_node)}) must match number of "
                                 f"placement groups ({len(groups)})")
            counts = list(workers_per_node)
        else:
            raise ValueError("workers_per_node must be None (for default distribution), an int, or a list")
        counts = [numbers.integer(n, f"workers_per_node[{i}]" if isinstance(workers_per_node, list) else
                                  "workers_per_node", 1) for i, n in enumerate(counts)]
        for i, (pg, n) in enumerate(zip(groups, counts)):
            if n > pg.bundle_count:
                raise ValueError(f"Placement group {i} has {pg.bundle_count} bundles, but {n} workers were requested")
        return [(i, [b]) for i, n in enumerate(counts) for b in range(n)]

    def _create_workers_from_bundle_indices(self, remote_worker_builder: RayWorkerBuilder,
                                            bundle_indices_list: list[tuple[int, list[int]]],
                                            env_vars: Optional[dict[str, str]] = None) -> None:
        py_executable = get_actor_python_env(remote_worker_builder.ray_actor_class_fqn)
        if py_executable.startswith("uv"):
            raise ValueError(f"{remote_worker_builder.ray_actor_class_fqn} is registered to run under {py_executable!r}: "
                             "a uv environment built per actor, which this runtime does not build (one interpreter per "
                             "image); register PY_EXECUTABLES.SYSTEM or an interpreter's path")
        self.master_address, self.master_port = self.cluster.get_master_address_and_port()
        groups = self.cluster.get_placement_groups()
        slot_of = {(sl.placement_group.id, sl.bundle_index): sl for sl in self.cluster.slots()}
        base_env = {**os.environ, **(env_vars or {})}
        for k in RAY_PRIVATE_ENV:
            base_env.pop(k, None)
        self.world_size = sum(len(bundles) for _, bundles in bundle_indices_list)
        pairs = [(pg_idx, b) for pg_idx, bundles in bundle_indices_list for b in bundles]
        addr_ports = self.cluster.get_available_addresses_and_ports_batch(pairs)
        available = {"AVAILABLE_ADDR_LIST": str([a for a, _ in addr_ports]),
                     "AVAILABLE_PORT_LIST": str([p for _, p in addr_ports])}
        on_node: dict[int, int] = {}
        for pg_idx, _ in pairs:
            on_node[pg_idx] = on_node.get(pg_idx, 0) + 1
        num_gpus = 1 / self.cluster.max_colocated_worker_groups if self.cluster.use_gpus else 0
        # one initializer per node imports the class and starts that node's workers; it gets what the
        # import needs (the interpreter, PYTHONPATH, Hugging Face's module cache for remote code)
        init_env: dict = {}
        if py_executable != sys.executable:
            init_env["py_executable"] = py_executable
        import_vars = {k: base_env[k] for k in ("PYTHONPATH", "HF_HOME", "HF_MODULES_CACHE") if k in base_env}
        if import_vars:
            init_env["env_vars"] = import_vars
        self._init_env = init_env
        for pg_idx in sorted({pg_idx for pg_idx, _ in bundle_indices_list}):
            self._initializer_pool[pg_idx] = remote_worker_builder.initializer(init_env)
        rank = 0
        for group_idx, (pg_idx, bundles) in enumerate(bundle_indices_list):
            pg = groups[0] if len(groups) == 1 else groups[pg_idx]
            tied = len(bundles) > 1
            for local_rank, bundle_idx in enumerate(bundles):
                slot = slot_of.get((pg.id, bundle_idx))
                if slot is None:
                    raise ValueError(f"bundle {bundle_idx} of placement group {pg_idx}: that group has "
                                     f"{pg.bundle_count} bundles")
                slot = dataclasses.replace(slot, local_world_size=on_node[pg_idx])
                env = {**base_env, **rank_env(rank, self.world_size, slot, self.master_address, self.master_port),
                       **available}
                runtime_env: dict = {"env_vars": env}
                if py_executable != sys.executable:
                    runtime_env["py_executable"] = py_executable
                leads = local_rank == 0
                bundle_indices = (pg_idx, list(bundles)) if leads else None
                if leads:
                    self.dp_leader_worker_indices.append(rank)
                name = (f"{self.name_prefix}-grp{group_idx}-{local_rank}" if tied
                        else f"{self.name_prefix}-{pg_idx}-{bundle_idx}")
                start = _WorkerStart(pg_idx, tied, dict(
                    placement_group=pg, placement_group_bundle_index=bundle_idx, num_gpus=num_gpus,
                    bundle_indices=bundle_indices, num_gpus_per_node=self.cluster.num_gpus_per_node,
                    runtime_env=runtime_env, name=name))
                self._starts.append(start)
                self._worker_metadata.append({"node_idx": pg_idx, "local_rank": local_rank, "global_rank": rank,
                                              "name": name, "bundle_indices": bundle_indices,
                                              "dp_shard_idx": group_idx})
                rank += 1
        self.members.start_all(len(self._starts))  # the handles, once every actor is submitted

    # -- who is who -----------------------------------------------------------------------------------
    def _start_worker(self, worker: int, again: bool):
        """An ObjectRef of a new actor for WORKER, as _starts records it, from its node's initializer (one
        that is alive, when it replaces a dead worker). The group's `start` for runtime.workers.members."""
        start = self._starts[worker]
        initializer = self._live_initializer(start.pg_idx) if again else self._initializer_pool[start.pg_idx]
        return initializer.create_worker.remote(**start.options)

    def _worker_nodes(self) -> list[Optional[str]]:
        """The Ray node ID of each worker's bundle (one query of the cluster's bundles)."""
        bundles = self._node_of_bundle()
        return [bundles.get(start.bundle) for start in self._starts]

    @property
    def worker_metadata(self) -> list[dict[str, Any]]:
        return self._worker_metadata

    @property
    def dp_size(self) -> int:
        """Data-parallel shards: one per tied group (one per worker when none are tied)."""
        return len(self.dp_leader_worker_indices)

    def get_dp_leader_worker_idx(self, dp_shard_idx: int) -> int:
        if not 0 <= dp_shard_idx < len(self.dp_leader_worker_indices):
            raise IndexError(f"Data parallel shard index {dp_shard_idx} is out of range. Valid range is "
                             f"[0, {len(self.dp_leader_worker_indices) - 1}]")
        return self.dp_leader_worker_indices[dp_shard_idx]

    def _method(self, worker, method_name: str):
        try:
            return getattr(worker, method_name)
        except AttributeError:
            raise AttributeError(f"the workers ({type(worker).__name__}) have no method {method_name!r}") from None

    def _runs(self, worker_idx: int, rank_0_only_axes: list[str]) -> bool:
        """False when the worker is not at coordinate 0 of one of `rank_0_only_axes`."""
        if not rank_0_only_axes:
            return True
        if self.sharding_annotations is None:
            raise ValueError("run_rank_0_only_axes needs the group's sharding_annotations")
        coords = self.sharding_annotations.get_worker_coords(worker_idx)
        return all(coords[axis] == 0 for axis in rank_0_only_axes if axis in coords)

    # -- calls ------------------------------------------------------------------------------------------
    def run_single_worker_single_data(self, method_name: str, worker_idx: int, *args, **kwargs) -> ray.ObjectRef:
        """`method_name(**kwargs)` on worker `worker_idx`."""
        _keywords_only(args, "run_single_worker_single_data")
        return self._method(self.workers[worker_idx], method_name).remote(**kwargs)

    def run_all_workers_single_data(self, method_name: str, *args, run_rank_0_only_axes: Optional[list[str]] = None,
                                    **kwargs) -> list[ray.ObjectRef]:
        """`method_name(**kwargs)` on every worker (those at coordinate 0 of run_rank_0_only_axes);
        each value is put in the object store once and shared."""
        _keywords_only(args, "run_all_workers_single_data")
        kwargs = {k: ray.put(v) for k, v in kwargs.items()}
        return [self._method(w, method_name).remote(**kwargs)
                for i, w in enumerate(self.workers) if self._runs(i, run_rank_0_only_axes or [])]

    def run_all_workers_multiple_data(self, method_name: str, *args, run_rank_0_only_axes: Optional[list[str]] = None,
                                      common_kwargs: Optional[dict[str, Any]] = None, **kwargs) -> list[ray.ObjectRef]:
        """Each keyword holds one value per called worker: the n-th called worker gets item n of each,
        plus common_kwargs. Without run_rank_0_only_axes every worker is called."""
        _keywords_only(args, "run_all_workers_multiple_data")
        if not kwargs:
            raise AssertionError("run_all_workers_multiple_data needs per-worker data (name=[one value per worker]); "
                                 "use run_all_workers_single_data to send every worker the same")
        for name, values in kwargs.items():
            per_worker(values, name)
        counts = {len(v) for v in kwargs.values()}
        if len(counts) != 1:
            raise AssertionError(f"every keyword must hold the same number of items, got "
                                 f"{ {k: len(v) for k, v in kwargs.items()} }")
        count = counts.pop()
        if run_rank_0_only_axes is None and count != len(self.workers):
            raise AssertionError(f"data length should be equal to the number of workers: data length = {count}, "
                                 f"number of workers = {len(self.workers)}")
        chosen = [i for i in range(len(self.workers)) if self._runs(i, run_rank_0_only_axes or [])]
        if count != len(chosen):
            raise AssertionError(f"data length should be equal to the number of workers started: data length = "
                                 f"{count}, number of workers started = {len(chosen)}")
        common_kwargs = common_kwargs or {}
        return [self._method(self.workers[w], method_name).remote(**{k: v[n] for k, v in kwargs.items()},
                                                                   **common_kwargs)
                for n, w in enumerate(chosen)]

    def run_all_workers_sharded_data(self, method_name: str, *args, in_sharded_axes: Optional[list[str]] = None,
                                     replicate_on_axes: Optional[list[str]] = None,
                                     output_is_replicated: Optional[list[str]] = None,
                                     make_dummy_calls_to_free_axes: bool = False,
                                     common_kwargs: Optional[dict[str, Any]] = None, **kwargs) -> MultiWorkerFuture:
        """Data laid out along named axes of sharding_annotations:
        - in_sharded_axes: each keyword is nested lists indexed by these axes' coordinates, in this
          order; a worker gets the element at its coordinates;
        - replicate_on_axes: every worker along these axes gets the same element;
        - any other (free) axis: only its coordinate-0 workers are called (the others get a call
          with None for every keyword when make_dummy_calls_to_free_axes), and only they return;
        - output_is_replicated: of these axes only the coordinate-0 workers' results are returned.
        Returns a MultiWorkerFuture (which worker each future runs on, whose results count)."""
        _keywords_only(args, "run_all_workers_sharded_data")
        sharding = self.sharding_annotations
        if sharding is None:
            raise ValueError("Sharding annotations must be provided to use sharded data distribution")
        in_sharded_axes, replicate_on_axes = list(in_sharded_axes or []), list(replicate_on_axes or [])
        output_is_replicated, common_kwargs = list(output_is_replicated or []), common_kwargs or {}
        for axis in in_sharded_axes + replicate_on_axes:
            if axis not in sharding.names:
                raise ValueError(f"Axis '{axis}' not found in sharding annotations. Valid axes: {sharding.names}")
        both = set(in_sharded_axes) & set(replicate_on_axes)
        if both:
            raise ValueError(f"Axes cannot be both sharded and replicated: {both}")
        if math.prod(sharding.get_axis_size(a) for a in replicate_on_axes) > 1:
            # the same element goes to several workers: put each once
            def put_leaves(value, depth):
                return ray.put(value) if depth == 0 else [put_leaves(v, depth - 1) for v in value]
            kwargs = {k: put_leaves(v, len(in_sharded_axes)) for k, v in kwargs.items()}
        free = [a for a in sharding.names if a not in in_sharded_axes and a not in replicate_on_axes]
        futures, called, returning = [], [], []
        for idx, worker in enumerate(self.workers):
            coords = sharding.get_worker_coords(idx)
            off_free = any(coords[a] != 0 for a in free)
            if not off_free and not any(coords.get(a, 0) != 0 for a in output_is_replicated):
                returning.append(idx)
            if off_free:
                if not make_dummy_calls_to_free_axes:
                    continue
                mine = {k: None for k in kwargs}
            else:
                mine = dict(kwargs)
                for axis in in_sharded_axes:
                    mine = {k: v[coords[axis]] for k, v in mine.items()}
            futures.append(self._method(worker, method_name).remote(**mine, **common_kwargs))
            called.append(idx)
        return MultiWorkerFuture(futures=futures, return_from_workers=returning, called_workers=called)

    def get_all_worker_results(self, future_bundle: MultiWorkerFuture,
                               return_generators_as_proxies: bool = False) -> list:
        """ray.get of a MultiWorkerFuture: one result per worker in its return_from_workers."""
        return future_bundle.get_results(self, return_generators_as_proxies=return_generators_as_proxies)

    # -- recovery (opt-in: restart_on_failure) ------------------------------------------------------------
    def dead_workers(self, timeout_s: float = 10.0) -> list[int]:
        """The indices of the workers whose actors are gone: Ray says so when asked (within timeout_s), or
        the worker does not answer in time and its bundle's node is dead. One that does not answer while
        its node is alive is busy (a call waits for the one running before it) and is not counted: a
        worker still in a long call is not taken for dead and restarted (the group core's check,
        runtime.workers.members, as for the worker half's group)."""
        return self.members.dead(timeout_s)

    def _node_of_bundle(self) -> dict:
        """(placement group ID, bundle index) -> the Ray node ID it is on, for every bundle of the cluster."""
        return {(sl.placement_group.id, sl.bundle_index): sl.node_id for sl in self.cluster.slots()}

    def restart_failed_workers(self) -> list[int]:
        """Start the dead workers' actors again from the same builder, with the same options, environment,
        init arguments and name (so its __init__, the worker's setup, runs again); the indices restarted.
        Each goes into a spare bundle of the cluster where there is one (a bundle that holds none of this
        group's workers, on a node Ray counts alive; one on the dead worker's own node first), else into
        the dead worker's own bundle; a tied group's worker (bundle_indices_list) always goes back into
        its own. What an actor held is gone with it: its state is the caller's to restore, as in NeMo
        RL. Needs restart_on_failure=True; past max_restarts a WorkerFailureError says so."""
        dead = self.dead_workers()
        self.members.spend_restart(dead)  # the one policy (runtime.workers.members): refused, saying why
        if not dead:
            return []
        spares = self._spare_bundles()
        for i in dead:
            if spares and not self._starts[i].tied:
                self._move(i, *self._nearest(spares, self._starts[i].pg_idx))
        self.members.replace(dead, wait_ready=True)  # killed, started again from _starts; their __init__ done
        return dead

    def _live_initializer(self, pg_idx: int):
        """The initializer of placement group `pg_idx`, started now if it has none or its own is gone (an
        initializer on a lost node went with it)."""
        initializer = self._initializer_pool.get(pg_idx)
        if initializer is not None:
            try:
                ray.get(initializer.__ray_ready__.remote(), timeout=10)
                return initializer
            except Exception:  # noqa: BLE001 - gone or not answering: replaced
                pass
        initializer = self._initializer_pool[pg_idx] = self._builder.initializer(self._init_env)
        return initializer

    def _spare_bundles(self) -> list[tuple[int, Any, int]]:
        """(pg_idx, placement group, bundle) of every bundle of the cluster that holds none of this group's
        workers, on a node Ray counts alive, in cluster order."""
        groups = self.cluster.get_placement_groups()
        used = {start.bundle for start in self._starts}
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        node_of = self._node_of_bundle()
        return [(pg_idx, pg, b) for pg_idx, pg in enumerate(groups) for b in range(pg.bundle_count)
                if (pg.id, b) not in used and node_of.get((pg.id, b)) in alive]

    @staticmethod
    def _nearest(spares: list, pg_idx: int) -> tuple[int, Any, int]:
        """The spare bundle to take (and remove from `spares`): one in placement group `pg_idx` (the same
        node) if there is one, else the first."""
        pick = next((s for s in spares if s[0] == pg_idx), spares[0])
        spares.remove(pick)
        return pick

    def _move(self, worker: int, pg_idx: int, pg, bundle: int) -> None:
        """Start `worker` from now on in `bundle` of placement group `pg_idx`: the same options otherwise;
        its bundle_indices (a leader's) and metadata say where it is."""
        start = self._starts[worker]
        options = {**start.options, "placement_group": pg, "placement_group_bundle_index": bundle}
        if options["bundle_indices"] is not None:
            options["bundle_indices"] = (pg_idx, [bundle])
        self._starts[worker] = _WorkerStart(pg_idx, start.tied, options)
        meta = self._worker_metadata[worker]
        meta["node_idx"] = pg_idx
        if meta.get("bundle_indices") is not None:
            meta["bundle_indices"] = options["bundle_indices"]

    # -- teardown ---------------------------------------------------------------------------------------
    def shutdown(self, cleanup_method: Optional[str] = None, timeout: Optional[float] = 30.0,
                 force: bool = False) -> bool:
        """Stop every worker. With cleanup_method (and not force) it runs on every worker first, for up
        to `timeout` seconds (None: as long as it takes); the workers are then killed in any case, which
        also frees their actor names. False if a cleanup failed or timed out, or a kill failed."""
        if not self.workers:
            return True
        ok = True
        if cleanup_method is not None and not force:
            try:
                ray.get(self.run_all_workers_single_data(cleanup_method), timeout=timeout)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
                ok = False
                print(f"Error during graceful shutdown: {e}. Falling back to force termination.", flush=True)
        ok = self.members.kill_all() and ok
        for initializer in self._initializer_pool.values():  # after the workers: they own them
            try:
                ray.kill(initializer)
            except Exception as e:
                print(f"Error killing a worker initializer: {e}", flush=True)
        self._initializer_pool = {}
        self._worker_metadata = []
        return ok

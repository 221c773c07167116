"""RayWorkerGroup: one actor per bundle, torch.distributed ready, run a method on all workers.

Failure handling restarts the *whole* group when the workers share a torch process group (a
process group cannot re-admit one rank): new actors, a new master port, and the worker class
reloads its last checkpoint in __init__. After a restart the call raises WorkerGroupRestarted so
the driver can re-sync its step; past max_restarts it raises WorkerFailureError naming the worker
and the cause. Groups without collectives (backend=None) restart only their dead workers.

Every option is checked once, by GroupOptions, before Ray or the cluster sees any: a bad one is an
InputError (a ValueError) that names it, says what was wrong and what to give.

A failed collective is traced to the lost rank by the group itself (every worker and a spare per
node are asked; the one still silent LOST_GRACE_S after the others answered is lost: its
FailureDetector, which sees the group only through failure_view()), and a lost node's placement
group is moved at once, without waiting for Ray's health checks. With spare_workers=True the new
ranks are taken from spare hosts (started, torch imported: see runtime.workers.host_pool). Call
data goes through runtime.workers.transfer: put once, passed by reference, CPU tensors zero-copy;
or made on the workers with run_all_workers_own_shard and a ShardLoader.

The seed's (NeMo RL's) group options, each with a meaning here:
    memory_limit                each worker's RSS is held to it (over it, the worker is stopped and the
                                group's error names the limit and the peak); where the cluster reserves
                                memory (memory_per_bundle), Ray also reserves it per actor
    async_communication         run_all_workers_* return a WorkerGroupFuture (await it, .result(),
                                or combine several with gather_futures) instead of the results
    enable_load_balancing /     run_work_items(method, items) hands items to workers: round_robin
    load_balancing_strategy     (item i -> worker i % n) or least_loaded (the next item to whichever
                                worker is free first)
    enable_gradient_compression "fp16", "bf16" or "powersgd" (True = fp16): runtime.workers.comm_hooks.compress_gradients(model)
                                in the worker registers torch's DDP communication hook
    spare_workers               keep spare hosts for fast restarts (runtime.workers.host_pool); not with a reserved memory_limit
"""
from __future__ import annotations

import re
import sys
import time
from typing import Callable, Optional

import ray
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runtime.workers.comm_hooks import COMPRESSION_ENV, COMPRESSIONS
from runtime.contract import RESTARTS
from runtime import numbers
from runtime.workers import output_flush, transfer
from runtime.workers.batched import BatchedDataDict
from runtime.workers.rank_env import rank_env
from runtime.workers.transfer import ShardLoader, per_worker
from runtime.workers.failures import (Failure, FailureDetector, GroupView, WorkerFailureError, WorkerGroupRestarted,
                                      WorkerProcess, format_phases)
from runtime.workers.host_pool import HostPool
from runtime.workers.members import GroupOfMembers, Members
from runtime.errors import InputError
from runtime.workers.virtual_cluster import BACKENDS, BundleSlot, RayVirtualCluster, parse_bytes

LB_STRATEGIES = ("round_robin", "least_loaded")


class WorkerGroupClosed(RuntimeError):
    """A call on a worker group after its shutdown()."""


class WorkerGroupFuture:
    """Results of one call on all workers, not yet fetched: `result()`, `await`, or gather_futures()."""

    def __init__(self, group: "RayWorkerGroup", refs: list, timeout: Optional[float]):
        self.group, self.refs, self.timeout = group, refs, timeout

    def result(self) -> list:
        return self.group._collect(self.refs, self.timeout)

    def __await__(self):
        import asyncio
        return asyncio.get_event_loop().run_in_executor(None, self.result).__await__()


def gather_futures(*futures: WorkerGroupFuture) -> list[list]:
    """Wait for several calls (on one or several groups) at once; a list of results per future."""
    refs = [r for f in futures for r in f.refs]
    ray.wait(refs, num_returns=len(refs))
    return [f.result() for f in futures]


WEEK_S = 7 * 86400.0  # the longest timeout an option takes


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")  # a process environment's name, as a shell reads one

class GroupOptions(BaseModel):
    """Every option of a RayWorkerGroup, checked once (GroupOptions.parse), by name, before Ray or the
    cluster sees any. Numbers go through runtime.numbers, sizes through parse_bytes; a bad option is an
    InputError (a ValueError) that starts with the option's name, says what was wrong and what to give.
    `strategy` and `compression` are the resolved load-balancing strategy and compression kind."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    init_args: tuple = ()
    init_kwargs: dict = Field(default_factory=dict)
    backend: Optional[str] = "auto"  # "auto" (the cluster's communication_backend), "nccl", "gloo", None
    restart_on_failure: bool = False
    max_restarts: int = 0
    call_timeout_s: Optional[float] = None
    init_timeout_s: float = 120.0
    env: dict = Field(default_factory=dict)
    colocated_share: Optional[float] = None
    memory_limit: Optional[int] = None  # bytes
    async_communication: bool = False
    enable_load_balancing: bool = False
    load_balancing_strategy: Optional[str] = None
    enable_gradient_compression: Optional[str] = None  # the kind; True is given as "fp16", False as None
    spare_workers: bool = False

    @classmethod
    def parse(cls, **options) -> "GroupOptions":
        try:
            return cls.model_validate(options)
        except ValidationError as e:
            raise InputError("\n".join(_option_errors(e))) from None

    @property
    def strategy(self) -> str:
        return self.load_balancing_strategy or ("least_loaded" if self.enable_load_balancing else "round_robin")

    @property
    def compression(self) -> Optional[str]:
        return self.enable_gradient_compression

    @field_validator("init_args", mode="before")
    @classmethod
    def _init_args(cls, v):
        if not isinstance(v, (tuple, list)):
            raise InputError(f"init_args: {str(v)[:40]!r} is not a tuple; give the worker class's positional "
                             "arguments as a tuple, e.g. (path,)")
        return tuple(v)

    @field_validator("init_kwargs", "env", mode="before")
    @classmethod
    def _mapping(cls, v, info):
        v = {} if v is None else v
        what = "keyword arguments of the worker class" if info.field_name == "init_kwargs" else "variables"
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise InputError(f"{info.field_name}: {str(v)[:40]!r} is not a dict of names; give the {what} as a "
                             "dict with str keys")
        if info.field_name == "env":
            for name, value in v.items():
                if not ENV_NAME.fullmatch(name):
                    raise InputError(f"env: {name[:40]!r} is not a variable name; give names of letters, digits and "
                                     "_ that do not start with a digit (e.g. NCCL_DEBUG)")
                if not isinstance(value, str) or "\x00" in value:
                    raise InputError(f"env: {name}={value!r:.40} is not text without NUL; give every variable's "
                                     "value as a str (e.g. \"1\")")
        return dict(v)

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, v):
        if v not in (None, "auto", *BACKENDS):
            raise InputError(f"backend: {str(v)[:40]!r} is not one of auto, {', '.join(BACKENDS)} or None "
                             "(None: no torch process group)")
        return v

    @field_validator("restart_on_failure", "async_communication", "enable_load_balancing", "spare_workers",
                     mode="before")
    @classmethod
    def _boolean(cls, v, info):
        return numbers.boolean(v, info.field_name)

    @field_validator("max_restarts", mode="before")
    @classmethod
    def _restarts(cls, v):
        return numbers.integer(v, "max_restarts", 0, 10_000)

    @field_validator("call_timeout_s", mode="before")
    @classmethod
    def _call_timeout(cls, v):
        return None if v is None else numbers.finite(v, "call_timeout_s", 0, WEEK_S, low_open=True)

    @field_validator("init_timeout_s", mode="before")
    @classmethod
    def _init_timeout(cls, v):
        return numbers.finite(v, "init_timeout_s", 0, WEEK_S, low_open=True)

    @field_validator("colocated_share", mode="before")
    @classmethod
    def _share(cls, v):
        return None if v is None else numbers.finite(v, "colocated_share", 0, 1, low_open=True)

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, v):
        if isinstance(v, (bool, float)):
            raise InputError(f"memory_limit: {v!r} is not a size; give bytes as an int or text such as 8GB")
        size = parse_bytes(v, "memory_limit")
        if size is not None and size <= 0:
            raise InputError(f"memory_limit: {v!r} must be a positive size such as 8GB")
        return size

    @field_validator("load_balancing_strategy", mode="before")
    @classmethod
    def _strategy(cls, v):
        if v not in (None, *LB_STRATEGIES):
            raise InputError(f"load_balancing_strategy: {str(v)[:40]!r} is not one of {', '.join(LB_STRATEGIES)}")
        return v

    @field_validator("enable_gradient_compression", mode="before")
    @classmethod
    def _compression(cls, v):
        kind = "fp16" if v is True else None if v is None or v is False else v
        if kind not in (None, *COMPRESSIONS):
            raise InputError(f"enable_gradient_compression: {str(v)[:40]!r} is not True or one of "
                             f"{', '.join(COMPRESSIONS)}")
        return kind

    @model_validator(mode="after")
    def _compression_needs_backend(self):
        if self.compression and not self.backend:
            raise InputError("enable_gradient_compression: it compresses DDP gradients, which needs a torch process "
                             "group; give backend \"auto\", \"nccl\" or \"gloo\", or drop the compression")
        return self

    def reserved_memory(self, cluster: RayVirtualCluster) -> Optional[int]:
        """The memory Ray reserves per worker: memory_limit, where the cluster reserves memory per bundle
        (memory_per_bundle), checked against the worker's share of it; None where it reserves none."""
        reserved = cluster.memory_per_bundle
        if not (self.memory_limit and reserved):
            return None
        colocated = cluster.max_colocated_worker_groups
        share = reserved / colocated
        if self.memory_limit > share:
            raise InputError(f"memory_limit {self.memory_limit / 2**30:.2f} GiB cannot be met: the cluster reserves "
                             f"{share / 2**30:.2f} GiB per worker (memory_per_bundle); lower memory_limit, or create "
                             f"the cluster with memory_per_bundle=\"{self.memory_limit * colocated / 2**30:.0f}GB\"")
        if self.spare_workers:
            raise InputError("spare_workers: with a reserved memory_limit, a rank taken by a spare does not hold a "
                             "Ray memory reservation; use one or the other (without memory_per_bundle the limit "
                             "is enforced on each worker and spares work)")
        return self.memory_limit


def _option_errors(err: ValidationError) -> list[str]:
    """One line per bad option: our own validators' words (they name the option), else pydantic's."""
    lines = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        name = str(e["loc"][0]) if e["loc"] else "(options)"
        if isinstance(cause, InputError):
            lines.append(str(cause))
        elif e["type"] == "extra_forbidden":
            lines.append(f"{name}: not an option of RayWorkerGroup (its options: {', '.join(GroupOptions.model_fields)})")
        else:
            lines.append(f"{name}: {e['msg']} (got {str(e.get('input'))[:80]!r})")
    return lines


class RayWorkerGroup(GroupOfMembers):
    def __init__(self, virtual_cluster: RayVirtualCluster, worker_class, *, init_args: tuple = (),
                 init_kwargs: Optional[dict] = None, backend: Optional[str] = "auto", restart_on_failure: bool = False,
                 max_restarts: int = 0, call_timeout_s: Optional[float] = None, init_timeout_s: float = 120,
                 env: Optional[dict] = None, colocated_share: Optional[float] = None,
                 memory_limit=None, async_communication: bool = False, enable_load_balancing: bool = False,
                 load_balancing_strategy: Optional[str] = None, enable_gradient_compression=False,
                 spare_workers: bool = False):
        # every option checked once, by name, before Ray or the cluster sees it (Ray's own words name no option)
        opts = self.options = GroupOptions.parse(
            init_args=init_args, init_kwargs=init_kwargs, backend=backend, restart_on_failure=restart_on_failure,
            max_restarts=max_restarts, call_timeout_s=call_timeout_s, init_timeout_s=init_timeout_s, env=env,
            colocated_share=colocated_share, memory_limit=memory_limit, async_communication=async_communication,
            enable_load_balancing=enable_load_balancing, load_balancing_strategy=load_balancing_strategy,
            enable_gradient_compression=enable_gradient_compression, spare_workers=spare_workers)
        # Ray reserves the limit where the cluster reserves memory (memory_per_bundle); every worker's
        # RSS is held to it in any case (runtime.workers.usage.enforce_memory_limit): over it, the worker stops
        self._ray_memory = opts.reserved_memory(virtual_cluster)
        self._closed = False
        self.cluster = virtual_cluster
        self.worker_class = worker_class
        self.init_args, self.init_kwargs = opts.init_args, dict(opts.init_kwargs)
        self.backend = virtual_cluster.communication_backend if opts.backend == "auto" else opts.backend
        self.memory_limit = opts.memory_limit
        self.load_balancing_strategy = opts.strategy
        self.async_communication = opts.async_communication
        self.compression = opts.compression
        self.restart_on_failure, self.max_restarts = opts.restart_on_failure, opts.max_restarts
        self.call_timeout_s, self.init_timeout_s = opts.call_timeout_s, opts.init_timeout_s
        self.extra_env = dict(opts.env)
        share = opts.colocated_share or 1 / virtual_cluster.max_colocated_worker_groups
        self._cpus = virtual_cluster.num_cpus_per_bundle * share
        self._gpus = share if virtual_cluster.use_gpus else 0
        self.slots: list[BundleSlot] = virtual_cluster.slots()
        # the workers, one per rank (runtime.workers.members: start, liveness, replacement, restarts left)
        self.members = Members(self._host_for, lambda: [sl.node_id for sl in self.slots],
                               restart_on_failure=opts.restart_on_failure, max_restarts=opts.max_restarts)
        # finds the rank behind a failed call, seeing only failure_view(); _fail decides what then
        self.detector = FailureDetector(self.failure_view)
        self._processes: list[Optional[WorkerProcess]] = []  # rank -> its process (pid, node), for log tails
        self.spares = HostPool(virtual_cluster.monitor_memory)  # every host of this group comes from here
        self.keep_spares = opts.spare_workers
        self._spares_due = False  # set once the group has (re)started: see _fill_spares
        self.last_start: dict = {}
        self.last_restart: dict = {}
        t0 = time.monotonic()
        if not self._ray_memory:  # hosts the launcher warmed up while its barrier waited (none outside it)
            self.spares.adopt({sl.node_id for sl in self.slots}, timeout_s=self.init_timeout_s)
        adopt_s = time.monotonic() - t0
        self._start()
        self.last_start["adopt_s"] = adopt_s  # waiting for warm hosts still importing
        self._spares_due = self.keep_spares

    def failure_view(self) -> GroupView:
        """What the FailureDetector may read of this group, now: workers, slots, spares, processes."""
        return GroupView(workers=tuple(self.workers), slots=tuple(self.slots),
                         spares_by_node={node: tuple(hosts) for node, hosts in self.spares.by_node.items()},
                         processes=tuple(self._processes), call_timeout_s=self.call_timeout_s)

    # -- lifecycle --------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.slots)

    @property
    def dp_size(self) -> int:
        return self.world_size

    def _host_for(self, rank: int, again: bool):
        """Rank's host: a spare on its slot's node if there is one (a lost node's spares were dropped), else
        a new actor in its bundle. The group's `start` for runtime.workers.members."""
        slot = self.slots[rank]
        return self.spares.take(slot.node_id) or self._spawn(rank, slot)

    def _start(self) -> None:
        """Every rank gets a host (_host_for), rank 0's host names the master port, then all join the
        process group and build the worker. Phase times land in self.last_start."""
        t0 = time.monotonic()
        spares_before = self.spares.count()
        self._processes = []  # the processes are known once the hosts answer
        hosts = self.members.start_all(len(self.slots))
        reused = spares_before - self.spares.count()
        addr, port = self._guard(lambda: [hosts[0].free_port.remote()], timeout=self.init_timeout_s, restartable=False)[0]
        self.master = (addr, port)
        t1 = time.monotonic()
        timings = self._guard(lambda: [self._setup(h, self._env(r, sl, addr, port), self.backend)
                                       for r, (h, sl) in enumerate(zip(hosts, self.slots))],
                              timeout=self.init_timeout_s, restartable=False)
        self._processes = self._process_of(self._guard(lambda: [w.status.remote() for w in self.workers],
                                                       timeout=self.init_timeout_s, restartable=False))
        self.last_start = {"hosts_s": t1 - t0, "spares_used": reused, "new_hosts": len(hosts) - reused,
                           "import_s": max(t["import_s"] for t in timings),
                           "dist_init_s": max(t["dist_init_s"] for t in timings),
                           "worker_init_s": max(t["worker_init_s"] for t in timings), "total_s": time.monotonic() - t0}

    def _env(self, rank: int, slot: BundleSlot, master_addr: str, master_port: int) -> dict:
        env = {**self.extra_env, **rank_env(rank, self.world_size, slot, master_addr, master_port),
               RESTARTS: str(self.restarts)}
        if self.compression:
            env[COMPRESSION_ENV] = self.compression
        return env

    def _setup(self, host, env: dict, backend: Optional[str]):
        """The host takes its rank: joins the process group (when `backend`) and builds the worker."""
        return host.setup.remote(self.worker_class, env, init_args=self.init_args, init_kwargs=self.init_kwargs,
                                 backend=backend, timeout_s=self.init_timeout_s, memory_limit=self.memory_limit)

    @staticmethod
    def _process_of(statuses: list[dict]) -> list[WorkerProcess]:
        return [WorkerProcess(pid=st["pid"], node_id=st["node_id"], node=st["node"]) for st in statuses]

    def _spawn(self, rank: int, slot: BundleSlot):
        return self.spares.in_bundle(rank, slot, self._cpus, self._gpus, memory=self._ray_memory,
                                     backend=bool(self.backend))

    def _require_open(self) -> None:
        if self._closed:
            raise WorkerGroupClosed("this worker group was shut down (shutdown()); its workers are gone: create a "
                                    "new RayWorkerGroup to run more work")

    def shutdown(self) -> None:
        self._closed = True
        for w in self.workers:
            try:
                ray.get(w.shutdown.remote(), timeout=10)
            except Exception:
                pass
        self.members.kill_all()
        self.spares.shutdown()

    def flush_output(self, timeout_s: float = 10.0) -> list[int]:
        """Wait until every line the workers printed so far has been shown by this driver, so that what
        it prints next (a summary) comes after the ranks' last lines: Ray forwards a worker's output a
        moment after it was printed, seconds on a busy node. Returns the ranks whose lines were still on
        their way after timeout_s (none, normally; every rank when ray.init(log_to_driver=False))."""
        self._require_open()
        return output_flush.flush(self.workers, numbers.finite(timeout_s, "timeout_s"))

    def _restart(self, rank: Optional[int] = None, node_lost: bool = False, attempts: int = 6,
                 pause_s: float = 0.5) -> dict:
        """Replace every worker (new processes: spares where there are some). When the failed rank's node
        is lost, its placement group is moved to another node at once instead of waiting for Ray's
        health checks. A node that just died may still look alive to Ray: a worker placed there fails
        at start-up, so start-up is retried within this one restart (spent by the caller: the group's
        one policy, Members.spend_restart). Returns the phase times."""
        t0 = time.monotonic()
        lost_node = self.slots[rank].node_id if rank is not None and node_lost else ""
        self.members.kill_all()
        if lost_node:
            self.spares.drop_node(lost_node)
        t1 = time.monotonic()
        moved = self.cluster.move_off(lost_node, self.spares.reserve_for(lost_node)) if lost_node else 0
        self.slots = self.cluster.slots()
        t2 = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                ray.get([pg.ready() for pg in self.cluster.get_placement_groups()], timeout=self.init_timeout_s)
                self._start()
                break
            except (WorkerFailureError, ray.exceptions.GetTimeoutError) as e:
                self.members.kill_all()
                if attempt == attempts:
                    raise WorkerFailureError(f"restart {self.restarts} could not bring the group back after "
                                             f"{attempts} start-up attempts: {e}") from None
                time.sleep(pause_s)
                self.slots = self.cluster.slots()
        self._spares_due = self.keep_spares
        return {"teardown_s": t1 - t0, "placement_s": t2 - t1, "moved_groups": moved, "start_attempts": attempt,
                **self.last_start}

    # -- failures -----------------------------------------------------------------------------
    def _guard(self, make_refs: Callable[[], list], timeout: Optional[float], restartable: bool = True,
               ranks: Optional[list[int]] = None) -> list:
        """ray.get the refs; on a failure, the detector finds the rank behind it and _fail reacts.
        `ranks[i]` is the rank refs[i] runs on (default: one ref per rank, in rank order)."""
        self._require_open()
        refs = make_refs()
        try:
            return ray.get(refs, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.RayTaskError) as e:
            failure = self.detector.locate(refs, ranks or list(range(len(refs))), e)
            if failure is None:  # every worker answers: the error is the user's own
                raise
        self._fail(failure, restartable)

    def _fail(self, failure: Failure, restartable: bool) -> None:
        """Restart the group (restart_on_failure, restarts left: raises WorkerGroupRestarted) or raise
        WorkerFailureError naming the rank, its node and the cause (with its last log lines)."""
        t0 = time.time()
        rank, node_lost = failure.rank, failure.node_lost
        detect = failure.detect or {"failure_seen_at": t0, "lost_rank_found_s": 0.0, "node_check_s": 0.0}
        node = self.slots[rank].node_ip if rank is not None else None
        cause = failure.cause + ("; its node is lost" if node_lost else self.detector.log_tail(rank))
        where = f"worker rank {rank} on {node}" if rank is not None else "a worker"
        if restartable and self.members.can_restart():
            self.members.spend_restart([rank])  # checked just above: spent here, the one place a failure spends it
            phases = self._restart(rank, node_lost)
            self.last_restart = {**detect, **phases, "restart_s": time.time() - t0}
            print(f"[worker-group] restart {self.restarts}/{self.max_restarts}: {where} "
                  f"{'(node lost) ' if node_lost else ''}{format_phases(self.last_restart)}", file=sys.stderr, flush=True)
            raise WorkerGroupRestarted(f"{where} failed ({cause}); restarted the group "
                                       f"({self.restarts}/{self.max_restarts})", rank, node) from None
        limit = f" after {self.restarts} restarts (max_restarts={self.max_restarts})" if self.restart_on_failure else ""
        raise WorkerFailureError(f"{where} failed{limit}: {cause}", rank, node) from None

    # -- calls ------------------------------------------------------------------
    def _fill_spares(self) -> None:
        """Start the missing spares once a call on the (re)started group has returned, not with the
        group: their torch imports would compete with the first step for the nodes' CPUs."""
        if self._spares_due:
            self._spares_due = False
            self.spares.fill([sl.node_id for sl in self.slots])

    def _collect(self, refs: list, timeout: Optional[float]) -> list:
        out = self._guard(lambda: refs, timeout)
        self._fill_spares()
        return out

    def _call(self, make_refs: Callable[[], list]):
        self._require_open()
        if self.async_communication:
            return WorkerGroupFuture(self, make_refs(), self.call_timeout_s)
        return self._collect(make_refs(), self.call_timeout_s)

    def run_all_workers_single_data(self, method_name: str, *args, **kwargs):
        """The method on every worker with the same arguments; results in rank order (a future when
        async_communication). Data arguments (tensors, arrays, batches) are put in the object store
        once and every worker gets the same reference (runtime.workers.transfer)."""
        args = tuple(transfer.put(a) for a in args)
        kwargs = {k: transfer.put(v) for k, v in kwargs.items()}
        return self._call(lambda: [w.execute.remote(method_name, *args, **kwargs) for w in self.workers])

    def run_all_workers_multiple_data(self, method_name: str, data_list: list, **kwargs):
        """Worker i gets data_list[i] (each item put in the object store once, CPU tensors zero-copy;
        ObjectRefs are passed through and resolved on the worker); results in rank order (a future
        when async_communication)."""
        per_worker(data_list, "data_list", self.world_size)
        refs = transfer.put_each(list(data_list))
        kwargs = {k: transfer.put(v) for k, v in kwargs.items()}
        return self._call(lambda: [w.execute.remote(method_name, d, **kwargs) for w, d in zip(self.workers, refs)])

    def run_all_workers_sharded_batch(self, method_name: str, data: BatchedDataDict, batch_size: Optional[int] = None,
                                      **kwargs):
        """Split one BatchedDataDict over the data-parallel ranks (shard_by_batch_size), put each shard
        in the object store once, and run."""
        return self.run_all_workers_multiple_data(method_name, data.shard_by_batch_size(self.dp_size, batch_size), **kwargs)

    def run_all_workers_own_shard(self, method_name: str, loader: ShardLoader, **kwargs):
        """Each worker makes or reads its own shard, `loader(rank, world_size)`, and runs
        `method(shard, **kwargs)`: no data leaves the driver (the loader travels, a few bytes)."""
        if not isinstance(loader, ShardLoader):
            raise TypeError(f"run_all_workers_own_shard needs a runtime.workers.transfer.ShardLoader(fn, *args), got {loader!r}")
        return self._call(lambda: [w.execute_own_shard.remote(method_name, loader, **kwargs) for w in self.workers])

    def run_all_workers_sharded_data(self, *args, **kwargs):
        raise TypeError("run_all_workers_sharded_data: NeMo RL's call, with data sharded along named axes, is on "
                        "runtime.nemo_rl.worker_groups.RayWorkerGroup; this group shards one batch over its "
                        "data-parallel ranks with run_all_workers_sharded_batch(method, batch), or takes one item per "
                        "worker with run_all_workers_multiple_data(method, items)")

    def run_work_items(self, method_name: str, items: list, strategy: Optional[str] = None, **kwargs) -> list:
        """Every item through `method_name` on some worker, results in item order. round_robin: item i
        to worker i % n, in order; least_loaded: each worker takes the next item as soon as it is free."""
        self._require_open()
        strategy = strategy or self.load_balancing_strategy
        if strategy not in LB_STRATEGIES:
            raise InputError(f"strategy: {strategy!r} is not one of {', '.join(LB_STRATEGIES)}")
        results: list = [None] * len(items)
        n = len(self.workers)
        if strategy == "round_robin":
            queues = [[i for i in range(len(items)) if i % n == w] for w in range(n)]
        else:
            queues = None
        todo = list(range(len(items)))
        running: dict = {}
        def submit(w: int) -> None:
            if queues is not None:
                if queues[w]:
                    i = queues[w].pop(0)
                    running[self.workers[w].execute.remote(method_name, items[i], **kwargs)] = (w, i)
            elif todo:
                i = todo.pop(0)
                running[self.workers[w].execute.remote(method_name, items[i], **kwargs)] = (w, i)
        for w in range(n):
            submit(w)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=self.call_timeout_s)
            if not ready:
                w = running[next(iter(running))][0]
                self._fail(Failure(w, f"no answer within {self.call_timeout_s}s (stuck)", False, {}), True)
            ref = ready[0]
            w, i = running.pop(ref)
            results[i] = self._guard(lambda: [ref], None, ranks=[w])[0]  # a failure here is worker w's
            submit(w)
        self._fill_spares()
        return results

    def get_resource_usage(self, timeout_s: float = 5) -> list[dict]:
        """Per worker: RSS now and at peak, CPU percent since the last ask, CUDA memory where present."""
        refs = [w.usage.remote() for w in self.workers]
        out = []
        for rank, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=timeout_s))
            except Exception as e:
                out.append({"rank": rank, "node": self.slots[rank].node_ip, "error": str(e).splitlines()[0]})
        return out

    def detect_stuck_workers(self, threshold_s: float = 60, timeout_s: float = 5) -> list[dict]:
        """Workers busy in one call for longer than threshold_s (or not answering): rank, node, method, seconds."""
        stuck = []
        for st in self.get_worker_status(timeout_s):
            if st["state"] == "unresponsive" or (st["state"] == "busy" and st.get("busy_for_s", 0) > threshold_s):
                stuck.append({"rank": st["rank"], "node": st["node"], "method": st.get("busy"),
                              "busy_for_s": st.get("busy_for_s"), "state": st["state"]})
        return stuck

    def restart_failed_workers(self) -> list[int]:
        """Replace dead workers; returns the ranks that were dead. With a torch process group
        (backend nccl/gloo) the whole group restarts, because a process group cannot re-admit one
        rank: every worker reloads its checkpoint in __init__. Without one (backend=None) only the
        dead workers are replaced (a spare host on the node where there is one), the others keep their
        state. Dead, and replaced, as the group core decides it (runtime.workers.members, which the NeMo RL
        face's group uses too)."""
        dead = self.members.dead(timeout_s=5)
        self.members.spend_restart(dead)  # the one policy (runtime.workers.members): refused, saying why
        if not dead:
            return []
        if self.backend:
            self._restart(dead[0], node_lost=not self.detector.node_alive(dead[0]))
            return dead
        self.members.replace(dead)
        env = [self._env(r, self.slots[r], *self.master) for r in dead]
        ray.get([self._setup(self.workers[r], e, backend=None) for r, e in zip(dead, env)], timeout=self.init_timeout_s)
        for r, proc in zip(dead, self._process_of(ray.get([self.workers[r].status.remote() for r in dead],
                                                         timeout=self.init_timeout_s))):
            self._processes[r] = proc  # the new processes' logs, for the next failure's log tail
        return dead

    def get_worker_status(self, timeout_s: float = 5) -> list[dict]:
        refs = [w.status.remote() for w in self.workers]
        out = []
        for rank, ref in enumerate(refs):
            slot = self.slots[rank]
            try:
                st = ray.get(ref, timeout=timeout_s)
                out.append({**st, "state": "busy" if st["busy"] else "idle"})
            except ray.exceptions.GetTimeoutError:
                out.append({"rank": rank, "node": slot.node_ip, "state": "unresponsive"})
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                out.append({"rank": rank, "node": slot.node_ip, "state": "dead", "cause": str(e).splitlines()[0]})
        return out

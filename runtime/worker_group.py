"""RayWorkerGroup: one actor per bundle, torch.distributed ready, run a method on all workers.

Failure handling restarts the *whole* group when the workers share a torch process group (a
process group cannot re-admit one rank): new actors, a new master port, and the worker class
reloads its last checkpoint in __init__. After a restart the call raises WorkerGroupRestarted so
the driver can re-sync its step; past max_restarts it raises WorkerFailureError naming the worker
and the cause. Groups without collectives (backend=None) restart only their dead workers.

The seed's (NeMo RL's) group options, each with a meaning here:
    memory_limit                Ray `memory` per actor, drawn from the cluster's memory_per_bundle
    async_communication         run_all_workers_* return a WorkerGroupFuture (await it, .result(),
                                or combine several with gather_futures) instead of the results
    enable_load_balancing /     run_work_items(method, items) hands items to workers: round_robin
    load_balancing_strategy     (item i -> worker i % n) or least_loaded (the next item to whichever
                                worker is free first)
    enable_gradient_compression "fp16", "bf16" or "powersgd" (True = fp16): runtime.comm_hooks.compress_gradients(model)
                                in the worker registers torch's DDP communication hook
"""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Callable, Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime.comm_hooks import COMPRESSION_ENV, COMPRESSIONS
from runtime.contract import RESTARTS
from runtime.usage import process_usage, reset_cuda_peak
from runtime.batched import BatchedDataDict
from runtime.virtual_cluster import BundleSlot, RayVirtualCluster

# how long a failed collective waits for Ray to say which worker is gone (health checks take ~5 s)
PEER_CHECK_S = 20.0


LB_STRATEGIES = ("round_robin", "least_loaded")


class WorkerFailureError(RuntimeError):
    def __init__(self, message: str, rank: Optional[int] = None, node: Optional[str] = None):
        super().__init__(message)
        self.rank, self.node = rank, node


class WorkerGroupRestarted(WorkerFailureError):
    """The group was restarted after a failure; worker state is back at the last checkpoint."""


@ray.remote(num_cpus=0)
def _read_worker_log(pid: int, lines: int) -> str:
    """The tail of a worker process's Ray log files on this node."""
    import glob
    out = []
    try:  # this node's own session (the launcher may have given Ray a --temp-dir)
        logs = ray._private.worker._global_node.get_logs_dir_path()
    except AttributeError:
        logs = "/tmp/ray/session_latest/logs"
    for path in sorted(glob.glob(f"{logs}/worker-*-{pid}.*")):
        if path.endswith((".out", ".err")):
            with open(path, errors="replace") as f:
                out.extend(f.read().splitlines()[-lines:])
    return "\n".join(out[-lines:])


class _WorkerHost:
    """Hosts one user worker: sets rank variables, joins torch.distributed, runs methods."""

    def __init__(self, worker_cls, env: dict, init_args: tuple, init_kwargs: dict, backend: Optional[str], timeout_s: float,
                 monitor_memory: bool = False):
        os.environ.update(env)
        self.rank = int(env["RANK"])
        self.node = env["NODE_IP"]
        self.busy: Optional[str] = None
        self.busy_since = 0.0
        self.started = time.time()
        self.monitor_memory = monitor_memory
        self._cpu = (time.monotonic(), time.process_time())
        if backend:
            import torch.distributed as dist
            dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                                    rank=self.rank, world_size=int(env["WORLD_SIZE"]), timeout=timedelta(seconds=timeout_s))
        self.worker = worker_cls(*init_args, **init_kwargs)

    def execute(self, method: str, *args, **kwargs):
        self.busy, self.busy_since = method, time.monotonic()
        if self.monitor_memory:
            reset_cuda_peak()
        try:
            return getattr(self.worker, method)(*args, **kwargs)
        finally:
            self.busy = None

    def status(self) -> dict:
        return {"rank": self.rank, "node": self.node, "pid": os.getpid(), "busy": self.busy,
                "busy_for_s": round(time.monotonic() - self.busy_since, 2) if self.busy else 0.0,
                "node_id": ray.get_runtime_context().get_node_id(), "uptime_s": round(time.time() - self.started, 1)}

    def usage(self) -> dict:
        """RSS now and at its peak, CPU use since the last call, and CUDA memory where present."""
        sample, self._cpu = process_usage(self._cpu)
        return {"rank": self.rank, "node": self.node, **sample}

    def shutdown(self) -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this
        return f"rank{self.rank}@{self.node}"


WorkerHost = ray.remote(max_concurrency=2)(_WorkerHost)


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


class RayWorkerGroup:
    def __init__(self, virtual_cluster: RayVirtualCluster, worker_class, *, init_args: tuple = (),
                 init_kwargs: Optional[dict] = None, backend: Optional[str] = "auto", restart_on_failure: bool = False,
                 max_restarts: int = 0, call_timeout_s: Optional[float] = None, init_timeout_s: float = 120,
                 env: Optional[dict] = None, colocated_share: Optional[float] = None,
                 memory_limit=None, async_communication: bool = False, enable_load_balancing: bool = False,
                 load_balancing_strategy: Optional[str] = None, enable_gradient_compression=False):
        self.cluster = virtual_cluster
        self.worker_class = worker_class
        self.init_args, self.init_kwargs = init_args, dict(init_kwargs or {})
        self.backend = virtual_cluster.communication_backend if backend == "auto" else backend
        if load_balancing_strategy not in (None, *LB_STRATEGIES):
            raise ValueError(f"load_balancing_strategy: {load_balancing_strategy!r} is not one of {', '.join(LB_STRATEGIES)}")
        self.load_balancing_strategy = load_balancing_strategy or ("least_loaded" if enable_load_balancing else "round_robin")
        self.async_communication = async_communication
        compression = "fp16" if enable_gradient_compression is True else (enable_gradient_compression or None)
        if compression not in (None, *COMPRESSIONS):
            raise ValueError(f"enable_gradient_compression: {enable_gradient_compression!r} is not True or one of "
                             f"{', '.join(COMPRESSIONS)}")
        if compression and not self.backend:
            raise ValueError("enable_gradient_compression compresses DDP gradients; it needs a backend (nccl/gloo)")
        self.compression = compression
        from runtime.virtual_cluster import parse_bytes
        self.memory_limit = parse_bytes(memory_limit, "memory_limit")
        if self.memory_limit:
            reserved = virtual_cluster.memory_per_bundle
            share = reserved / virtual_cluster.max_colocated_worker_groups if reserved else 0
            if self.memory_limit > share:
                have = f"reserves {share / 2**30:.2f} GiB per worker" if reserved else "reserves no memory"
                raise ValueError(f"memory_limit {self.memory_limit / 2**30:.2f} GiB cannot be met: the cluster {have}; "
                                 f"create it with RayVirtualCluster(..., memory_per_bundle=\"{self.memory_limit * virtual_cluster.max_colocated_worker_groups / 2**30:.0f}GB\") "
                                 "on nodes that have it, or lower memory_limit")
        self.restart_on_failure, self.max_restarts = restart_on_failure, max_restarts
        self.call_timeout_s, self.init_timeout_s = call_timeout_s, init_timeout_s
        self.extra_env = dict(env or {})
        share = colocated_share or 1 / virtual_cluster.max_colocated_worker_groups
        self._cpus = virtual_cluster.num_cpus_per_bundle * share
        self._gpus = share if virtual_cluster.use_gpus else 0
        self.restarts = 0
        self.slots: list[BundleSlot] = virtual_cluster.slots()
        self.workers: list = []
        self._start()

    # -- lifecycle --------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.slots)

    @property
    def dp_size(self) -> int:
        return self.world_size

    def _strategy(self, slot: BundleSlot):
        return PlacementGroupSchedulingStrategy(placement_group=slot.placement_group,
                                                placement_group_bundle_index=slot.bundle_index)

    def _start(self) -> None:
        master_addr, master_port = self.cluster.get_master_address_and_port()  # in rank 0's bundle
        self.master = (master_addr, master_port)
        self.workers = []
        for rank, slot in enumerate(self.slots):
            self.workers.append(self._spawn(rank, slot, master_addr, master_port))
        self._info = self._guard(lambda: [w.status.remote() for w in self.workers], timeout=self.init_timeout_s,
                                 restartable=False)

    def _env(self, rank: int, slot: BundleSlot, master_addr: str, master_port: int) -> dict:
        env = {**self.extra_env, "RANK": str(rank), "LOCAL_RANK": str(slot.local_rank),
               "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(slot.local_world_size),
               "NODE_RANK": str(slot.node_rank), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
               "NODE_IP": slot.node_ip, RESTARTS: str(self.restarts)}
        if slot.gpu_id is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu_id)
        if self.compression:
            env[COMPRESSION_ENV] = self.compression
        return env

    def _spawn(self, rank: int, slot: BundleSlot, master_addr: str, master_port: int):
        opts = dict(scheduling_strategy=self._strategy(slot), num_cpus=self._cpus, num_gpus=self._gpus)
        if self.memory_limit:
            opts["memory"] = self.memory_limit
        return WorkerHost.options(**opts).remote(self.worker_class, self._env(rank, slot, master_addr, master_port),
                                                 self.init_args, self.init_kwargs, self.backend, self.init_timeout_s,
                                                 self.cluster.monitor_memory)

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                ray.get(w.shutdown.remote(), timeout=10)
            except Exception:
                pass
            ray.kill(w)
        self.workers = []

    def _restart(self, attempts: int = 6, pause_s: float = 3.0) -> None:
        """Replace every worker. A node that just died may still look alive to Ray for a few seconds
        (until its health checks fail and its placement group is rescheduled): a worker placed there
        fails at start-up, so start-up is retried within this one restart."""
        self.restarts += 1
        for attempt in range(1, attempts + 1):
            for w in self.workers:
                ray.kill(w, no_restart=True)
            try:
                ray.get([pg.ready() for pg in self.cluster.get_placement_groups()], timeout=self.init_timeout_s)
                self._start()
                return
            except (WorkerFailureError, ray.exceptions.GetTimeoutError) as e:
                if attempt == attempts:
                    raise WorkerFailureError(f"restart {self.restarts} could not bring the group back after "
                                             f"{attempts} start-up attempts: {e}") from None
                time.sleep(pause_s)

    # -- calls ------------------------------------------------------------------
    def _guard(self, make_refs: Callable[[], list], timeout: Optional[float], restartable: bool = True) -> list:
        refs = make_refs()
        try:
            return ray.get(refs, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.WorkerCrashedError) as e:
            rank, cause = self._find_failure(refs, e)
        except ray.exceptions.RayTaskError as e:
            # A collective (all-reduce) fails on the survivors, "connection reset by peer", before Ray
            # reports the lost worker: that is a worker failure, not an error in the user's code.
            rank = self._lost_worker(PEER_CHECK_S)
            if rank is None:
                raise
            cause = f"lost while the others were in a collective ({str(e).splitlines()[0][:160]})"
        self._fail(rank, cause, restartable)

    def _fail(self, rank: Optional[int], cause: str, restartable: bool) -> None:
        node = self.slots[rank].node_ip if rank is not None else None
        cause += self._log_tail(rank)
        where = f"worker rank {rank} on {node}" if rank is not None else "a worker"
        if restartable and self.restart_on_failure and self.restarts < self.max_restarts:
            self._restart()
            raise WorkerGroupRestarted(f"{where} failed ({cause}); restarted the group "
                                       f"({self.restarts}/{self.max_restarts})", rank, node) from None
        limit = f" after {self.restarts} restarts (max_restarts={self.max_restarts})" if self.restart_on_failure else ""
        raise WorkerFailureError(f"{where} failed{limit}: {cause}", rank, node) from None

    def _lost_worker(self, within_s: float) -> Optional[int]:
        """The rank of a worker Ray reports dead, asking each one; None if none is within the window
        (then the error is the user's). A call to an actor on a lost node fails once Ray declares
        the node dead (a few seconds); a worker that is merely busy is not counted as lost."""
        refs = [w.__ray_ready__.remote() for w in self.workers]
        pending, deadline = list(refs), time.monotonic() + within_s
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                    return refs.index(ref)
        return None

    def _log_tail(self, rank: Optional[int], lines: int = 20) -> str:
        """The failing worker's last log lines, read on its node (if that node is still up)."""
        info = getattr(self, "_info", None)
        if rank is None or not info:
            return ""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        try:
            text = ray.get(_read_worker_log.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                info[rank]["node_id"], soft=False)).remote(info[rank]["pid"], lines), timeout=10)
        except Exception:
            return f"\n  (no log tail: node {info[rank]['node']} is gone)"
        return f"\n  last log lines of rank {rank}:\n    " + "\n    ".join(text.splitlines()) if text else ""

    def _find_failure(self, refs: list, err: Exception) -> tuple[Optional[int], str]:
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0)
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                    return i, f"actor died: {str(e).splitlines()[0]}"
                except Exception:
                    continue
        if isinstance(err, ray.exceptions.GetTimeoutError) and not_ready:
            i = refs.index(not_ready[0])
            return i, f"no answer within {self.call_timeout_s}s (stuck)"
        return None, str(err).splitlines()[0]

    def _collect(self, refs: list, timeout: Optional[float]) -> list:
        return self._guard(lambda: refs, timeout)

    def _call(self, make_refs: Callable[[], list]):
        if self.async_communication:
            return WorkerGroupFuture(self, make_refs(), self.call_timeout_s)
        return self._guard(make_refs, self.call_timeout_s)

    def run_all_workers_single_data(self, method_name: str, *args, **kwargs):
        """The method on every worker with the same arguments; results in rank order (a future when
        async_communication)."""
        return self._call(lambda: [w.execute.remote(method_name, *args, **kwargs) for w in self.workers])

    def run_all_workers_multiple_data(self, method_name: str, data_list: list, **kwargs):
        """Worker i gets data_list[i]; results in rank order (a future when async_communication)."""
        if len(data_list) != self.world_size:
            raise ValueError(f"data_list has {len(data_list)} items for {self.world_size} workers")
        return self._call(lambda: [w.execute.remote(method_name, d, **kwargs) for w, d in zip(self.workers, data_list)])

    def run_all_workers_sharded_batch(self, method_name: str, data: BatchedDataDict, batch_size: Optional[int] = None,
                                      **kwargs):
        """Split one BatchedDataDict over the data-parallel ranks (shard_by_batch_size) and run."""
        return self.run_all_workers_multiple_data(method_name, data.shard_by_batch_size(self.dp_size, batch_size), **kwargs)

    def run_all_workers_sharded_data(self, *args, **kwargs):
        raise TypeError("run_all_workers_sharded_data: NeMo RL's takes data already sharded along named axes "
                        "(in_sharded_axes, replicate_on_axes); this group shards one batch over its data-parallel "
                        "ranks with run_all_workers_sharded_batch(method, batch), or takes one item per worker with "
                        "run_all_workers_multiple_data(method, items)")

    def run_work_items(self, method_name: str, items: list, strategy: Optional[str] = None, **kwargs) -> list:
        """Every item through `method_name` on some worker, results in item order. round_robin: item i
        to worker i % n, in order; least_loaded: each worker takes the next item as soon as it is free."""
        strategy = strategy or self.load_balancing_strategy
        if strategy not in LB_STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not one of {', '.join(LB_STRATEGIES)}")
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
                self._fail(running[next(iter(running))][0], f"no answer within {self.call_timeout_s}s (stuck)", True)
            ref = ready[0]
            w, i = running.pop(ref)
            results[i] = self._guard(lambda: [ref], None)[0]
            submit(w)
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
        dead workers are replaced, the others keep their state."""
        dead = [s["rank"] for s in self.get_worker_status() if s["state"] == "dead"]
        if not dead:
            return []
        if self.backend:
            self._restart()
            return dead
        self.restarts += 1
        for rank in dead:
            ray.kill(self.workers[rank], no_restart=True)
            self.workers[rank] = self._spawn(rank, self.slots[rank], *self.master)
        ray.get([self.workers[r].__ray_ready__.remote() for r in dead], timeout=self.init_timeout_s)
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

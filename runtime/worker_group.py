"""RayWorkerGroup: one actor per bundle, torch.distributed ready, run a method on all workers.

Failure handling restarts the *whole* group (a torch process group cannot re-admit one rank):
new actors, a new master port, and the worker class reloads its last checkpoint in __init__.
After a restart the call raises WorkerGroupRestarted so the driver can re-sync its step;
past max_restarts it raises WorkerFailureError naming the worker and the cause.
"""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Callable, Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runtime.contract import RESTARTS
from runtime.batched import BatchedDataDict
from runtime.virtual_cluster import BundleSlot, RayVirtualCluster

# how long a failed collective waits for Ray to say which worker is gone (health checks take ~5 s)
PEER_CHECK_S = 20.0


class WorkerFailureError(RuntimeError):
    def __init__(self, message: str, rank: Optional[int] = None, node: Optional[str] = None):
        super().__init__(message)
        self.rank, self.node = rank, node


class WorkerGroupRestarted(WorkerFailureError):
    """The group was restarted after a failure; worker state is back at the last checkpoint."""


@ray.remote(num_cpus=0)
def _probe_master_port() -> tuple[str, int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


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

    def __init__(self, worker_cls, env: dict, init_args: tuple, init_kwargs: dict, backend: Optional[str], timeout_s: float):
        os.environ.update(env)
        self.rank = int(env["RANK"])
        self.node = env["NODE_IP"]
        self.busy: Optional[str] = None
        self.started = time.time()
        if backend:
            import torch.distributed as dist
            dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                                    rank=self.rank, world_size=int(env["WORLD_SIZE"]), timeout=timedelta(seconds=timeout_s))
        self.worker = worker_cls(*init_args, **init_kwargs)

    def execute(self, method: str, *args, **kwargs):
        self.busy = method
        try:
            return getattr(self.worker, method)(*args, **kwargs)
        finally:
            self.busy = None

    def status(self) -> dict:
        return {"rank": self.rank, "node": self.node, "pid": os.getpid(), "busy": self.busy,
                "node_id": ray.get_runtime_context().get_node_id(), "uptime_s": round(time.time() - self.started, 1)}

    def shutdown(self) -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this
        return f"rank{self.rank}@{self.node}"


WorkerHost = ray.remote(max_concurrency=2)(_WorkerHost)


class RayWorkerGroup:
    def __init__(self, virtual_cluster: RayVirtualCluster, worker_class, *, init_args: tuple = (),
                 init_kwargs: Optional[dict] = None, backend: Optional[str] = "auto", restart_on_failure: bool = False,
                 max_restarts: int = 0, call_timeout_s: Optional[float] = None, init_timeout_s: float = 120,
                 env: Optional[dict] = None, colocated_share: Optional[float] = None):
        self.cluster = virtual_cluster
        self.worker_class = worker_class
        self.init_args, self.init_kwargs = init_args, dict(init_kwargs or {})
        self.backend = ("nccl" if virtual_cluster.use_gpus else "gloo") if backend == "auto" else backend
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
        first = self.slots[0]
        master_addr, master_port = ray.get(_probe_master_port.options(scheduling_strategy=self._strategy(first)).remote())
        self.master = (master_addr, master_port)
        self.workers = []
        for rank, slot in enumerate(self.slots):
            env = {**self.extra_env, "RANK": str(rank), "LOCAL_RANK": str(slot.local_rank),
                   "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                   "NODE_RANK": str(slot.node_rank), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                   "NODE_IP": slot.node_ip, RESTARTS: str(self.restarts)}
            self.workers.append(WorkerHost.options(scheduling_strategy=self._strategy(slot), num_cpus=self._cpus,
                                                   num_gpus=self._gpus).remote(
                self.worker_class, env, self.init_args, self.init_kwargs, self.backend, self.init_timeout_s))
        self._info = self._guard(lambda: [w.status.remote() for w in self.workers], timeout=self.init_timeout_s,
                                 restartable=False)

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

    def run_all_workers_single_data(self, method_name: str, *args, **kwargs) -> list:
        return self._guard(lambda: [w.execute.remote(method_name, *args, **kwargs) for w in self.workers],
                           self.call_timeout_s)

    def run_all_workers_multiple_data(self, method_name: str, data_list: list, **kwargs) -> list:
        if len(data_list) != self.world_size:
            raise ValueError(f"data_list has {len(data_list)} items for {self.world_size} workers")
        return self._guard(lambda: [w.execute.remote(method_name, d, **kwargs) for w, d in zip(self.workers, data_list)],
                           self.call_timeout_s)

    def run_all_workers_sharded_data(self, method_name: str, data: BatchedDataDict, batch_size: Optional[int] = None,
                                     **kwargs) -> list:
        return self.run_all_workers_multiple_data(method_name, data.shard_by_batch_size(self.dp_size, batch_size), **kwargs)

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

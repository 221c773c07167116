"""The actor that hosts one user worker of a RayWorkerGroup, started in two phases.

Phase one (`__init__`) is the slow part of a worker's start: a new process, Ray's worker, and
`import torch`. Phase two (`setup`) joins torch.distributed and builds the user's worker class. A
host that has done phase one only is a *spare*: the group keeps some (spare_workers=True) so that a
restart after a failure skips the process start and the imports.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Optional

import ray

from runtime import contract as C
from runtime.workers.usage import enforce_memory_limit, process_usage, reset_cuda_peak

try:  # the line Ray's log monitor takes as a log file's new actor name
    from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME as ACTOR_NAME_LINE
except ImportError:  # pragma: no cover - its value in every Ray 2.x
    ACTOR_NAME_LINE = ":actor_name:"


@ray.remote(num_cpus=0)
def read_worker_log(pid: int, lines: int) -> str:
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


def node_ip() -> str:
    """The address this worker's node was started with, as the launcher logs it (it sets RAYTRAIN_NODE_IP
    for its Ray). ray.util.get_node_ip_address() in a worker process guesses the machine's routable address,
    which differs wherever nodes are given their own (several nodes per host, a pod IP)."""
    return os.environ.get(C.NODE_IP) or ray.util.get_node_ip_address()


class _WorkerHost:
    """Hosts one user worker: rank variables, torch.distributed, the user's methods."""

    def __init__(self, label: str = "spare", monitor_memory: bool = False, preload_torch: bool = True,
                 preload_ddp: bool = False):
        t0 = time.monotonic()
        self.label = label
        self.rank: Optional[int] = None
        self.node = node_ip()
        self.worker = None
        self.busy: Optional[str] = None
        self.busy_since = 0.0
        self.started = time.time()
        self.monitor_memory = monitor_memory
        self._claimed = False
        self._cpu = (time.monotonic(), time.process_time())
        if preload_torch:  # the slow imports, done before a rank is assigned (DDP and optim pull in most of torch)
            import torch.distributed  # noqa: F401
            import torch.nn.parallel  # noqa: F401
            import torch.optim  # noqa: F401
        if preload_ddp:  # building a DDP model imports torch._dynamo (sympy and more): ~1 s a spare does early
            import torch._dynamo  # noqa: F401
        self.import_s = time.monotonic() - t0

    def claim(self) -> bool:
        """True for the first caller only: a warm host started by the launcher goes to one group."""
        first, self._claimed = not self._claimed, True
        return first

    def free_port(self) -> tuple[str, int]:
        """An address and a free port on this host's node (rank 0 gives the group its master port)."""
        from runtime.workers import free_ports
        return ray.util.get_node_ip_address(), free_ports.any_port()

    def setup(self, worker_cls, env: dict, init_args: tuple, init_kwargs: dict, backend: Optional[str],
              timeout_s: float, memory_limit: Optional[int] = None) -> dict:
        """Take a rank: set its variables, join the process group, build the worker. Returns timings.
        With memory_limit (bytes), the process is stopped, saying why, once its RSS goes over it."""
        os.environ.update(env)
        self.rank = int(env["RANK"])
        self.node = env["NODE_IP"]
        self._name_in_logs(f"rank{self.rank}")
        if memory_limit:
            enforce_memory_limit(memory_limit, f"rank {self.rank} on {self.node} (pid {os.getpid()})")
        t0 = time.monotonic()
        if backend:
            import torch.distributed as dist
            dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                                    rank=self.rank, world_size=int(env["WORLD_SIZE"]), timeout=timedelta(seconds=timeout_s))
        t1 = time.monotonic()
        self.worker = worker_cls(*init_args, **init_kwargs)
        return {"import_s": self.import_s, "dist_init_s": t1 - t0, "worker_init_s": time.monotonic() - t1}

    def execute(self, method: str, *args, **kwargs):
        self.busy, self.busy_since = method, time.monotonic()
        if self.monitor_memory:
            reset_cuda_peak()
        try:
            return getattr(self.worker, method)(*args, **kwargs)
        finally:
            self.busy = None

    def execute_own_shard(self, method: str, loader, **kwargs):
        """`method(loader(rank, world_size))`: the worker makes or reads its own shard, nothing is shipped."""
        return self.execute(method, loader(self.rank, int(os.environ["WORLD_SIZE"])), **kwargs)

    def status(self) -> dict:
        return {"rank": self.rank, "node": self.node, "pid": os.getpid(), "busy": self.busy,
                "busy_for_s": round(time.monotonic() - self.busy_since, 2) if self.busy else 0.0,
                "node_id": ray.get_runtime_context().get_node_id(), "uptime_s": round(time.time() - self.started, 1)}

    def usage(self) -> dict:
        """RSS now and at its peak, CPU use since the last call, and CUDA memory where present."""
        sample, self._cpu = process_usage(self._cpu)
        return {"rank": self.rank, "node": self.node, **sample}

    def mark_output(self, line: str) -> None:
        """`line` on this process's stdout and stderr, after all it printed before (output_flush)."""
        for stream in (sys.stdout, sys.stderr):
            print(line, file=stream, flush=True)

    def shutdown(self) -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this (taken once, after __init__)
        return f"{getattr(self, 'label', 'worker')}@{getattr(self, 'node', '?')}"

    def _name_in_logs(self, label: str) -> None:
        """From now on Ray prefixes this process's lines with LABEL@node (a warm or spare host that takes a
        rank): its log monitor renames a log file's actor when the file says `:actor_name:<name>`, the
        line Ray's own worker writes once after __init__."""
        self.label = label
        for stream in (sys.stdout, sys.stderr):  # the node as the launcher logged it, as at __init__
            print(f"{ACTOR_NAME_LINE}{label}@{node_ip()}", file=stream, flush=True)


WorkerHost = ray.remote(max_concurrency=2)(_WorkerHost)

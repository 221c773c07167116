"""What a worker process uses: RSS now and at peak, CPU since the last sample, CUDA memory."""
from __future__ import annotations

import os
import resource
import time


def process_usage(last: tuple[float, float]) -> tuple[dict, tuple[float, float]]:
    """(sample, new `last`); `last` is the (wall, cpu) time of the previous sample."""
    wall, cpu = time.monotonic(), time.process_time()
    cpu_pct = 100.0 * (cpu - last[1]) / max(1e-6, wall - last[0])
    out = {"pid": os.getpid(), "rss_bytes": rss_bytes(), "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "cpu_percent": round(cpu_pct, 1)}
    try:
        import torch
        if torch.cuda.is_available():
            out.update(gpu_memory_bytes=torch.cuda.memory_allocated(),
                       gpu_peak_memory_bytes=torch.cuda.max_memory_allocated())
    except Exception:
        pass
    return out, (wall, cpu)


def reset_cuda_peak() -> None:
    """Start a new peak (monitor_memory: each call's own)."""
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    except Exception:
        pass


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


EXIT_MEMORY_LIMIT = 137  # what an out-of-memory kill gives, so schedulers and logs read it alike


def enforce_memory_limit(limit_bytes: int, label: str, interval_s: float = 0.05) -> None:
    """Stop this process when its RSS goes over `limit_bytes`, saying so on stderr (the group reads the
    worker's log tail into its error): a worker group's memory_limit where Ray reserves no memory
    (Ray's `memory` resource is only a scheduling reservation, so this holds where it does, too)."""
    import sys
    import threading

    def watch() -> None:
        peak = 0
        while True:
            rss = rss_bytes()
            peak = max(peak, rss)
            if rss > limit_bytes:
                print(f"memory_limit exceeded: {label} reached {peak / 2**20:.0f} MiB RSS (peak), over its "
                      f"memory_limit of {limit_bytes / 2**20:.0f} MiB; the worker is stopped", file=sys.stderr, flush=True)
                os._exit(EXIT_MEMORY_LIMIT)
            time.sleep(interval_s)
    threading.Thread(target=watch, name="memory-limit", daemon=True).start()

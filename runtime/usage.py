"""What a worker process uses: RSS now and at peak, CPU since the last sample, CUDA memory."""
from __future__ import annotations

import os
import resource
import time


def process_usage(last: tuple[float, float]) -> tuple[dict, tuple[float, float]]:
    """(sample, new `last`); `last` is the (wall, cpu) time of the previous sample."""
    wall, cpu = time.monotonic(), time.process_time()
    cpu_pct = 100.0 * (cpu - last[1]) / max(1e-6, wall - last[0])
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    out = {"pid": os.getpid(), "rss_bytes": rss, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
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

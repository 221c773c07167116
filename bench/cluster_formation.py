"""Cluster formation and recovery on the cpu image: 3 containers (head + 2 workers), SkyPilot-style env.

Prints: container start -> barrier passed, barrier latency (last node registered -> driver start),
beside the fixed sleeps of the documented Slurm template (10 s + 5 s per worker); and the time
from a worker kill to training resumed. Needs the images: `invoke build` first.
Run: .venv/bin/python bench/cluster_formation.py
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its reaper image cannot be pulled here
sys.path.insert(0, str(ROOT))

from test_runtime_containers import Job  # noqa: E402
from toolchain.records import read_builds  # noqa: E402


def wait_for(j, rank, pattern, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, j.logs(rank))
        if m:
            return m
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {pattern!r}:\n{j.logs(rank)[-2000:]}")


def main() -> None:
    image = read_builds(ROOT / "build")["cpu"].local_ref
    j = Job(image, train_args=["--steps", "60", "--step-delay", "0.3", "--ckpt-every", "5"])
    try:
        t0 = time.time()
        for r in (1, 2, 0):
            j.start(r)
        m = wait_for(j, 0, r"barrier passed: 3 node\(s\) alive ([\d.]+)s after head start; driver starts (\d+) ms")
        formed = time.time() - t0
        head_to_barrier, latency_ms = float(m.group(1)), int(m.group(2))
        wait_for(j, 0, r"\[driver\] step 15 ")
        j.containers[2].get_wrapped_container().kill()
        t_kill = time.time()
        wait_for(j, 0, r"resuming at step")
        wait_for(j, 0, r"resuming at step \d+[^\n]*\n(?:[^\n]*\n)*?\[driver\] step \d+ ")  # first step after it
        resumed = time.time() - t_kill
        code = j.wait(0, timeout=300)
        s = json.loads(next(l for l in j.logs(0).splitlines() if l.startswith("SUMMARY "))[8:])
        sleeps = 10 + 5 * 2
        print("cluster formation, 3 containers (head + 2 workers)")
        print(f"  container start -> barrier passed   {formed:6.2f} s  (head start -> barrier {head_to_barrier:.2f} s)")
        print(f"  barrier latency                     {latency_ms / 1000:6.3f} s  (target < 1 s)")
        print(f"  documented Slurm template sleeps    {sleeps:6.2f} s  -> ratio sleeps / ours {sleeps / formed:.1f}x")
        print(f"worker kill -> training resumed       {resumed:6.2f} s  (target < 20 s); job exit {code}, "
              f"steps {s['steps']}, restarts {s['restarts']}")
    finally:
        j.close()


if __name__ == "__main__":
    main()

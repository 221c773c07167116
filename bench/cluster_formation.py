"""Cluster formation, first step and recovery on the cpu image: 3 containers (head + 2 workers).

Prints: container start -> barrier passed, barrier latency (last node registered -> driver start),
beside the fixed sleeps of the documented Slurm template (10 s + 5 s per worker); barrier passed ->
first training step, with where the time goes; and worker container killed -> training resumed,
with where the time goes. Measured with spare workers (the example's default) and, in the same run,
without (--no-spares), and with workers started plainly instead of forked from the node's zygote
(launch --no-zygote). Needs the images: `invoke build` first.
Run: .venv/bin/python bench/cluster_formation.py [--no-baseline]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its reaper image cannot be pulled here
sys.path.insert(0, str(ROOT))

from bench.container_job import Job  # noqa: E402
from toolchain.records import read_builds  # noqa: E402

NUM = r"([\d.]+)"


def wait_for(j, rank, pattern, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, j.logs(rank))
        if m:
            return m
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {pattern!r}:\n{j.logs(rank)[-2000:]}")


def run_job(image: str, extra: list[str], launch_args: tuple[str, ...] = ()) -> dict:
    j = Job(image, train_args=["--steps", "40", "--step-delay", "0.3", "--ckpt-every", "5", *extra],
            launch_args=launch_args)
    try:
        t0 = time.time()
        for r in (1, 2, 0):
            j.start(r)
        m = wait_for(j, 0, rf"barrier passed: 3 node\(s\) alive {NUM}s after head start; driver starts (\d+) ms")
        barrier_at = time.time()  # when the line was seen here (the launcher's lines carry no clock), within a poll
        out = {"formed_s": barrier_at - t0, "head_to_barrier_s": float(m.group(1)), "latency_ms": int(m.group(2))}
        s = wait_for(j, 0, rf"\[driver\] startup: process start {NUM}; imports {NUM} s; ray.init {NUM} s; "
                           rf"placement groups {NUM} s; group {NUM} s \(warm hosts adopted after {NUM} s, "
                           rf"hosts {NUM} s, (\d+) taken from spares, "
                           rf"torch import {NUM} s, process group {NUM} s, worker init {NUM} s\)")
        first = wait_for(j, 0, rf"\) step 1 loss [\d.]+ at {NUM}s")  # a rank's line: seconds since the driver started
        v = [float(x) for x in s.groups()]
        first_at = v[0] + float(first.group(1))  # step lines count from the driver's process start
        out["start_to_first_step_s"] = first_at - t0
        startup_end = v[0] + v[1] + v[2] + v[3] + v[4]
        out["first_step"] = {
            "total": first_at - barrier_at,
            "launcher -> driver process": v[0] - barrier_at,
            "driver imports (ray, torch, runtime)": v[1],
            "ray.init": v[2],
            "placement groups": v[3],
            f"group: waiting for the {int(v[7])} hosts warmed up during the barrier": v[5],
            "group: hosts ready (new ones: process start + torch import)": v[6],
            "group: torch import inside the hosts (overlapped)": v[8],
            "group: process group (gloo) init": v[9],
            "group: worker __init__ (model, checkpoint)": v[10],
            "get_step + first step": first_at - startup_end,
        }
        wait_for(j, 0, r"\[driver\] step 15 ")
        t_kill = time.time()
        j.containers[2].get_wrapped_container().kill()
        rs = wait_for(j, 0, rf"\[worker-group\] restart 1/\d+: [^\n]*failure seen at {NUM}; lost rank found {NUM} s; "
                            rf"node checked {NUM} s; torn down {NUM} s; placement {NUM} s \((\d+) moved\); hosts {NUM} s "
                            rf"\((\d+) spares, (\d+) new, import {NUM} s\); process group {NUM} s; worker init {NUM} s; "
                            rf"restart total {NUM} s")
        res = wait_for(j, 0, rf"resuming at step (\d+) at {NUM}s")
        step = int(res.group(1))
        resumed_at = v[0] + float(res.group(2))
        after = wait_for(j, 0, rf"\[driver\] step {step + 1} loss [\d.]+ at {NUM}s")
        after_at = v[0] + float(after.group(1))
        g = [float(x) for x in rs.groups()]
        seen = g[0]
        out["recovery"] = {
            "total": after_at - t_kill,
            "kill -> failure seen by the driver": seen - t_kill,
            "lost rank found (group's own probe)": g[1],
            "its node checked": g[2],
            "old group torn down": g[3],
            f"placement ({int(g[5])} group moved off the lost node)": g[4],
            f"hosts ({int(g[7])} spares, {int(g[8])} new)": g[6],
            "process group (gloo) init": g[10],
            "worker __init__ (checkpoint load)": g[11],
            "get_step (driver re-sync)": resumed_at - (seen + g[1] + g[2] + g[12]),
            "first step after resume": after_at - resumed_at,
        }
        code = j.wait(0, timeout=300)
        summ = json.loads(next(l for l in j.logs(0).splitlines() if l.startswith("SUMMARY "))[8:])
        out["exit"], out["steps"], out["restarts"] = code, summ["steps"], summ["restarts"]
        return out
    finally:
        j.close()


def show(title: str, parts: dict, target: float) -> None:
    total = parts["total"]
    print(f"{title:44s} {total:6.2f} s  (target < {target:g} s: {'met' if total < target else 'missed'})")
    for k, v in parts.items():
        if k == "total":
            continue
        print(f"    {k:48s} {v:6.2f} s")


def report(r: dict) -> None:
    print(f"  container start -> barrier passed   {r['formed_s']:6.2f} s; container start -> first step "
          f"{r['start_to_first_step_s']:.2f} s")
    show("barrier passed -> first training step", r["first_step"], 3)
    show("worker container killed -> training resumed", r["recovery"], 10)
    print(f"  job exit {r['exit']}, steps {r['steps']}, restarts {r['restarts']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-baseline", action="store_true", help="Skip the run without spare workers.")
    args = p.parse_args()
    image = read_builds(ROOT / "build")["cpu"].local_ref.docker()
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min)")
    r = run_job(image, [])
    sleeps = 10 + 5 * 2
    print("cluster formation, 3 containers (head + 2 workers), 2 cores, CPU only")
    print(f"  container start -> barrier passed   {r['formed_s']:6.2f} s  (head start -> barrier {r['head_to_barrier_s']:.2f} s)")
    print(f"  barrier latency                     {r['latency_ms'] / 1000:6.3f} s  (target < 1 s)")
    print(f"  documented Slurm template sleeps    {sleeps:6.2f} s  -> ratio sleeps / ours {sleeps / r['formed_s']:.1f}x")
    rec, first = r["recovery"]["total"], r["first_step"]["total"]
    report(r)
    if not args.no_baseline:
        b = run_job(image, ["--no-spares"])
        print("same, without spare workers (--no-spares):")
        report(b)
        z = run_job(image, [], ("--no-zygote",))
        print("same, spares, workers not forked from a zygote (launch --no-zygote):")
        report(z)
        print(f"recovery, spares / no spares: {rec:.2f} s / {b['recovery']['total']:.2f} s = "
              f"{rec / b['recovery']['total']:.2f}")
        print(f"barrier -> first step, zygote / no zygote: {first:.2f} s / {z['first_step']['total']:.2f} s = "
              f"{first / z['first_step']['total']:.2f}; container start -> first step: "
              f"{r['start_to_first_step_s']:.2f} s / {z['start_to_first_step_s']:.2f} s")
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()

"""The README's main job on a busy machine: `invoke deploy --target local`, run again and again.

Two phases in one run, each RUNS jobs of the built and pushed image (3 nodes: head + 2 workers):
  quiet   nothing else runs;
  busy    a load generator runs beside every job (2 busy processes and one that writes to the disk),
          and in every job one worker is slow: its container is held to 0.05 CPU for 45 s (`docker
          update --cpus 0.05`, then back to unlimited), from the moment it exists (--slow-from create)
          or from when its launcher starts the node's Ray (--slow-from join).
Prints, per phase: jobs that passed out of RUNS, container start -> barrier passed (median, max), Ray
start retries seen in the logs, and barrier -> first training step (median, max).
Needs the images built and pushed: `invoke build push` first.
Run: .venv/bin/python bench/contention.py [--runs 10] [--phases quiet,busy]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
INVOKE = [str(ROOT / ".venv" / "bin" / "invoke")]
SLOW_CPUS = 0.05
SLOW_FOR_S = 45
JOB_TIMEOUT_S = 900

BARRIER = re.compile(r"barrier passed: \d+ node\(s\) alive ([\d.]+)s after head start; driver starts \d+ ms "
                     r"after the last node registered \(at ([\d.]+)")
FIRST_STEP = re.compile(r"\) step 1 loss [\d.]+ at ([\d.]+)s")  # a rank's line: seconds after the driver's start
DRIVER_START = re.compile(r"\[driver\] startup: process start ([\d.]+);")
RETRY = re.compile(r"ray start \((?:worker|--head)\) failed \(attempt \d+")


def _busy(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _writer(stop, directory: str) -> None:
    block = os.urandom(4 * 2**20)
    path = os.path.join(directory, "load.bin")
    while not stop.is_set():
        with open(path, "wb") as f:
            for _ in range(32):  # 128 MiB, flushed to the disk, then removed
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(path)


class Load:
    """2 busy processes and a disk writer, stopped (and their file removed) on exit."""

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="raytrain-bench-load-")
        self.stop = multiprocessing.Event()
        self.procs = [multiprocessing.Process(target=_busy, args=(self.stop,), daemon=True) for _ in range(2)]
        self.procs.append(multiprocessing.Process(target=_writer, args=(self.stop, self.dir), daemon=True))
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


def slow_worker(client: docker.DockerClient, done: threading.Event, seen: list, before: set, slow_from: str) -> None:
    """Hold the job's first worker container (alias *-w1; none of BEFORE, which existed before the job)
    to SLOW_CPUS for SLOW_FOR_S, from when it exists (SLOW_FROM "create") or from when its launcher
    says it is joining the cluster, i.e. starting its Ray ("join")."""
    while not done.is_set():
        # the low-level list (no inspect per container): a container of a job that is being removed is no error
        found = [c["Id"] for c in client.api.containers(all=True, filters={"name": "-w1-"})
                 if any(re.fullmatch(r"/.+-w1-[0-9a-f]{8}", n) for n in c["Names"]) and c["Id"] not in before]
        if found and slow_from == "join":
            try:  # throttle once the node starts its Ray, so Ray's own 30 s start wait falls inside
                joining = b"joining the cluster" in client.api.logs(found[0])
            except docker.errors.APIError:
                joining = False  # a container of an earlier job, being removed
            if not joining:
                time.sleep(0.1)
                continue
        if found:
            try:
                client.api.update_container(found[0], cpu_period=100_000, cpu_quota=int(SLOW_CPUS * 100_000))
            except docker.errors.APIError as e:  # not updatable yet (being created): try again
                seen.append(f"not throttled yet: {e}")
                time.sleep(0.05)
                continue
            seen.append(time.time())
            done.wait(SLOW_FOR_S)
            try:
                client.api.update_container(found[0], cpu_period=100_000, cpu_quota=-1)
            except docker.errors.APIError:
                pass  # the job ended first
            return
        time.sleep(0.05)


def one_job(client: docker.DockerClient, slow: bool, slow_from: str = "create") -> dict:
    done, throttled = threading.Event(), []
    before = {c["Id"] for c in client.api.containers(all=True)}
    watcher = (threading.Thread(target=slow_worker, args=(client, done, throttled, before, slow_from), daemon=True)
               if slow else None)
    if watcher:
        watcher.start()
    t0 = time.time()
    try:
        proc = subprocess.run([*INVOKE, "deploy", "--target", "local"], cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=JOB_TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    done.set()
    if watcher:
        watcher.join(timeout=60)
    b, f, d = BARRIER.search(out), FIRST_STEP.search(out), DRIVER_START.search(out)
    return {"rc": rc, "wall_s": time.time() - t0, "barrier_s": float(b.group(1)) if b else None,
            "first_step_s": float(d.group(1)) + float(f.group(1)) - float(b.group(2)) if b and f and d else None,
            "retries": len(RETRY.findall(out)), "throttled": any(isinstance(t, float) for t in throttled),
            "throttle_errors": sorted({t for t in throttled if isinstance(t, str)})[:2], "tail": out[-2500:],
            "fatal": out.count("Fatal Python error")}


def summary(name: str, runs: list[dict]) -> str:
    def stats(key: str) -> str:
        vals = [r[key] for r in runs if r[key] is not None]
        return f"{statistics.median(vals):6.1f} {max(vals):6.1f}" if vals else "     -      -"
    passed = sum(r["rc"] == 0 for r in runs)
    return (f"{name:<6} {passed:>2}/{len(runs):<3} {stats('barrier_s')}   {stats('first_step_s')}   "
            f"{sum(r['retries'] for r in runs):>7} {sum(r['fatal'] for r in runs):>6}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="Jobs per phase (default 10).")
    parser.add_argument("--phases", default="quiet,busy", help="Which phases, in order: quiet, busy (default both).")
    parser.add_argument("--slow-from", choices=("create", "join"), default="create",
                        help="When the slow worker is throttled: from its container's creation (its launcher is slow "
                             "too), or from when it starts its Ray (Ray's own 30 s wait for the raylet falls inside).")
    args = parser.parse_args()
    client = docker.from_env()
    results: dict[str, list] = {}
    for phase in [p for p in args.phases.split(",") if p]:
        if phase not in ("quiet", "busy"):
            parser.error(f"--phases: unknown phase {phase!r} (quiet, busy)")
        results[phase] = []
        for i in range(args.runs):
            if phase == "busy":
                with Load():
                    r = one_job(client, slow=True, slow_from=args.slow_from)
            else:
                r = one_job(client, slow=False)
            results[phase].append(r)
            print(f"[{phase} {i + 1}/{args.runs}] rc {r['rc']} in {r['wall_s']:.0f}s; barrier {r['barrier_s']}s; "
                  f"barrier->step 1 {r['first_step_s']}s; retries {r['retries']}; slow worker {r['throttled']}"
                  + (f" ({'; '.join(r['throttle_errors'])})" if r["throttle_errors"] else ""),
                  flush=True)
            if r["rc"] != 0:
                print("    " + r["tail"].replace("\n", "\n    "), flush=True)
    print(f"\n{os.cpu_count()} cores; busy = 2 busy processes + a disk writer, and one worker at {SLOW_CPUS} CPU "
          f"for {SLOW_FOR_S}s from {'its creation' if args.slow_from == 'create' else 'the start of its Ray'}")
    print("phase  passed  barrier s (median max)  barrier->step 1 s (median max)  retries  fatal")
    for name, runs in results.items():
        print(summary(name, runs))
    if "quiet" in results and "busy" in results:
        q = [r["barrier_s"] for r in results["quiet"] if r["barrier_s"]]
        b = [r["barrier_s"] for r in results["busy"] if r["barrier_s"]]
        if q and b:
            print(f"busy/quiet barrier median ratio: {statistics.median(b) / statistics.median(q):.2f}x")
    return 0 if all(r["rc"] == 0 for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

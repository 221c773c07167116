"""Past three nodes: the example's job on a real Slurm of N nodes on this host, for each N; or the
head's barrier modelled to 1,000 nodes and more without Ray processes.

    python bench/scale.py --nodes 3,8,16        # the rehearsal (starts its own Slurm, stops it after)
    python bench/scale.py --simulate 1000       # the model alone (bench/scale_model.py's barrier run)

The rehearsal starts munged (if needed), slurmctld and N `slurmd -N nK` on one host, as the tests'
fixture does with 3 (tests/helpers/slurm.py), submits the plain `slurm` target's sbatch script of the
example (1 worker per node, the venv running this script on every node with this checkout first on
its path, `--port-stride` for the shared host),
and watches the job's output file and the launchers' processes. For each N it prints one line:

    N=<n>: sbatch -> every node's launcher started, -> barrier passed, -> first step, -> SUMMARY (s);
    the head launcher's CPU seconds and each worker launcher's median and maximum (a launcher with
    its Ray agent, sampled from /proc every 0.2 s); the GCS key-value operations the agents made (each
    agent counts its own and says so as it ends); the world size; the machine's load before and after

The times are when a line appeared in the job's output file (read every 0.1 s). All N nodes share
this machine's cores, so the absolute times grow with N: what matters is how each phase grows per
node. Everything started is stopped, and the job's files removed, whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from deploy.job import JobSpec  # noqa: E402
from deploy.targets.slurm import sbatch  # noqa: E402
from runtime import contract as C  # noqa: E402

LAUNCHER = re.compile(r"\[launch node(\d+)/(\d+) ")
KV_LINE = re.compile(r"kv operations: (\d+) put, (\d+) get, (\d+) list")
CLK_TCK = os.sysconf("SC_CLK_TCK")
MEM_PER_NODE_GIB = 1.0  # a node's raylet, zygote (torch imported), Ray agent and one worker, measured at 16


class Launchers:
    """The CPU seconds of each node's launcher and Ray agent (by the node's Slurm step and task), read from
    /proc while they run: the last value seen is kept."""

    def __init__(self, job_name: str):
        self.job_name = job_name
        self.cpu: dict[tuple[str, str], dict[int, float]] = {}  # (step, task) -> pid -> CPU seconds
        self.head_key: tuple[str, str] | None = None

    def sample(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                launcher = b"runtime" in cmd and b"launch" in cmd and os.path.basename(cmd[0]) != b"srun"
                if not launcher and b"runtime.cluster.ray_agent" not in cmd:
                    continue
                env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(
                    errors="replace").split("\0") if "=" in kv)
                if env.get(C.JOB_NAME) != self.job_name:
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            key = (env.get("SLURM_STEP_ID", "?"), env.get("SLURM_PROCID", "?"))
            if env.get(C.NODE_RANK) == "0":
                self.head_key = key
            self.cpu.setdefault(key, {})[int(pid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK

    def per_node(self) -> tuple[float, list[float]]:
        """The head's CPU seconds and every worker node's."""
        totals = {key: sum(pids.values()) for key, pids in self.cpu.items()}
        head = totals.pop(self.head_key, 0.0)
        return head, sorted(totals.values())


def rehearse(n: int, work: Path, venv: Path, steps: int, port_base: int) -> dict:
    from helpers.slurm import SlurmCluster
    fileroot = work / f"fileroot-{n}"
    cluster = SlurmCluster(work / f"slurm-{n}", nodes=n, ctld_port=16960, node_port=17400)
    name = f"scale{n}"
    load0 = os.getloadavg()[0]
    try:
        cluster.start(timeout_s=120)
        job = JobSpec(name=name, nodes=n, cpus_per_node=2, fileroot=str(fileroot), workdir=str(ROOT / "examples" / "train"),
                      port_base=port_base, time_limit="30:00", env={C.KV_STATS: "1", "PYTHONPATH": str(ROOT)},
                      command=["python", "train.py", "--steps", str(steps), "--workers-per-node", "1",
                               "--cpus-per-worker", "0.5", "--no-spares", "--fileroot", str(fileroot)])
        script = work / f"{name}.sbatch"
        script.write_text(sbatch.render(job, env_setup=[f"source {venv / 'bin' / 'activate'}"], port_stride=200))
        t0 = time.monotonic()
        job_id = sbatch.submit(script, job, env=cluster.env)
        out_file = fileroot / "logs" / f"{name}-{job_id}.out"
        seen: list[tuple[float, str]] = []
        launchers, pos, buf = Launchers(name), 0, ""
        state, last_state_check = "", 0.0
        while True:
            now = time.monotonic()
            if out_file.exists():
                with open(out_file, errors="replace") as f:
                    f.seek(pos)
                    buf += f.read()
                    pos = f.tell()
                *lines, buf = buf.split("\n")
                seen += [(now - t0, line) for line in lines]
            launchers.sample()
            if now - last_state_check > 1:
                last_state_check = now
                out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                                     env=cluster.env).stdout
                state = dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get("JobState", "")
                if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                    break
            if now - t0 > 1800:
                raise RuntimeError(f"N={n}: the job did not end within 30 minutes")
            time.sleep(0.1 if now - t0 < 600 else 0.5)
        if buf:
            seen.append((time.monotonic() - t0, buf))
    finally:
        subprocess.run(["scancel", "--full", f"--name={name}"], env=cluster.env, capture_output=True)
        cluster.stop()
    return summarise(n, state, seen, launchers, load0, fileroot)


def summarise(n: int, state: str, seen: list, launchers: Launchers, load0: float, fileroot: Path) -> dict:
    def first(pattern: str):
        rx = re.compile(pattern)
        return next((t for t, line in seen if rx.search(line)), None)
    started = {}
    for t, line in seen:
        m = LAUNCHER.search(line)
        if m:
            started.setdefault(int(m.group(1)), t)
    summary = next((json.loads(line.split("SUMMARY ", 1)[1]) for _, line in seen if "SUMMARY " in line), None)
    kv = [tuple(int(x) for x in m.groups()) for m in (KV_LINE.search(line) for _, line in seen) if m]
    head_cpu, worker_cpu = launchers.per_node()
    log = "\n".join(line for _, line in seen)
    return {"n": n, "state": state, "launchers_started": len(started),
            "all_started_s": max(started.values()) if len(started) == n else None,
            "barrier_s": first(r"barrier passed"), "first_step_s": first(r"\) step 1 loss "),
            "summary_s": first(r"^SUMMARY |\] SUMMARY | SUMMARY \{"), "world_size": summary and summary["world_size"],
            "head_cpu_s": head_cpu, "worker_cpu_median_s": statistics.median(worker_cpu) if worker_cpu else None,
            "worker_cpu_max_s": max(worker_cpu) if worker_cpu else None, "sampled_nodes": 1 + len(worker_cpu),
            "kv": [sum(k[i] for k in kv) for i in range(3)] if kv else None, "kv_reports": len(kv),
            "load": (load0, os.getloadavg()[0]), "log_tail": log[-3000:], "fileroot": str(fileroot)}


def line(r: dict, base: dict | None) -> str:
    def s(v):
        return f"{v:.1f}s" if v is not None else "-"
    per = ""
    if base and base is not r and r["summary_s"] and base["summary_s"]:
        per = (f"; per node vs N={base['n']}: SUMMARY x{(r['summary_s'] / r['n']) / (base['summary_s'] / base['n']):.2f}, "
               f"head CPU x{(r['head_cpu_s'] / r['n']) / max(base['head_cpu_s'] / base['n'], 1e-9):.2f}")
    kv = (f"KV {r['kv'][0]} put, {r['kv'][1]} get, {r['kv'][2]} list ({r['kv_reports']} agents reporting)"
          if r["kv"] else "KV not reported")
    med = f"{r['worker_cpu_median_s']:.2f}" if r["worker_cpu_median_s"] is not None else "-"
    mx = f"{r['worker_cpu_max_s']:.2f}" if r["worker_cpu_max_s"] is not None else "-"
    return (f"N={r['n']}: {r['state']}; sbatch -> {r['launchers_started']}/{r['n']} launchers started "
            f"{s(r['all_started_s'])}, -> barrier {s(r['barrier_s'])}, -> first step {s(r['first_step_s'])}, "
            f"-> SUMMARY {s(r['summary_s'])}; world size {r['world_size']}; head launcher CPU {r['head_cpu_s']:.2f}s, "
            f"workers median {med}s max {mx}s ({r['sampled_nodes']} nodes sampled); {kv}; "
            f"load {r['load'][0]:.1f} -> {r['load'][1]:.1f}{per}")


def simulate(n: int, join_s: float, retrying: float) -> int:
    import scale_model
    template = scale_model.real_node_entry()
    r = scale_model.one(n, join_s, retrying, template)
    print(f"simulated {n} nodes: barrier passed after {r['rounds']} rounds in {r['wall_s']:.1f} s (nodes joining over "
          f"{join_s:g} s); head CPU {r['cpu_s']:.3f} s in all, {r['cpu_ms_per_round']:.2f} ms a round "
          f"({r['cpu_us_per_node_round']:.2f} us a node a round); KV {r['kv_list']} lists, {r['kv_get']} gets for "
          f"{r['records']} records ({r['record_bytes']} B); ray.nodes() {r['nodes_bytes_per_round'] / 1e6:.2f} MB a round",
          flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="3,8,16", help="comma-separated node counts for the rehearsal (default 3,8,16)")
    ap.add_argument("--simulate", type=int, metavar="N", help="run only the barrier model with N simulated nodes")
    ap.add_argument("--join-s", type=float, default=5.0, help="--simulate: seconds over which the nodes join")
    ap.add_argument("--steps", type=int, default=20, help="training steps of each job (default 20)")
    ap.add_argument("--port-base", type=int, default=20000,
                    help="the jobs' first port (node k: + k x 200; the last must stay below the ephemeral range)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (job logs) for a look after")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    if args.simulate:
        return simulate(args.simulate, args.join_s, 0.01)
    venv = Path(sys.executable).parent.parent
    counts = [int(x) for x in args.nodes.split(",")]
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    top = args.port_base + max(counts) * 200
    if top > ephemeral:
        print(f"--port-base {args.port_base}: {max(counts)} nodes 200 ports apart reach {top}, past the kernel's "
              f"ephemeral range (from {ephemeral}); give a lower one", file=sys.stderr)
        return 2
    need = max(counts) * MEM_PER_NODE_GIB
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    free = int(meminfo["MemAvailable"].split()[0]) / 2**20
    if free < need:
        print(f"only {free:.1f} GiB of memory free; N={max(counts)} needs about {need:.0f} GiB", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="raytrain-scale-"))
    print(f"rehearsal on this machine ({os.cpu_count()} cores, {free:.1f} GiB free), {args.steps} steps, "
          f"1 worker per node; work in {work}", flush=True)
    base, failed = None, 0
    try:
        for n in counts:
            r = rehearse(n, work, venv, args.steps, args.port_base)
            base = base or r
            print(line(r, base), flush=True)
            if r["state"] != "COMPLETED" or r["world_size"] != n:
                failed += 1
                print(f"N={n}: the job's last lines:\n{r['log_tail']}", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

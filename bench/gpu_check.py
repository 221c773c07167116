"""The GPU path, checked on a real GPU: one line per check (`CHECK <name>: ok|FAIL|SKIP <detail>`).

Run by bench/gpu_check.sh on a lent GPU machine (after it installs the carried wheels); runs on a CPU
machine too, where every check that needs CUDA says SKIP and the rest run on CPUs (gloo), so the
script itself is tested before it meets a GPU. Checks:
  selfcheck   python -m runtime selfcheck (--require-cuda with a GPU)
  launcher    python -m runtime launch on one node: the launcher's line reports `gpus N` (the CUDA devices)
              and the GPU type the spec maps the host name to
  group       a worker group (use_gpus with a GPU; gloo without): each rank's CUDA_VISIBLE_DEVICES and
              device, BatchedDataDict.to("cuda"), a DDP step (nccl with a GPU), and memory_limit honoured
  step-ratio  the same DDP step timed in the group against torchrun on the same device: the ratio
  example     the example itself (examples/train/train.py) through `python -m runtime launch` on one node with
              the node's GPUs: its ranks on cuda over nccl (SUMMARY's devices), and TensorBoard event files
              written with a loss per step (read back with TensorBoard's own reader). SKIP without a GPU: the
              tests run the same example on CPUs
Run: python bench/gpu_check.py [--steps 50]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPU_TYPE = "gpu-under-test"
FEATURES, BATCH = 1024, 2048
results: list[tuple[str, str]] = []


def report(name: str, status: str, detail: str = "") -> None:
    results.append((name, status))
    print(f"CHECK {name}: {status} {detail}".rstrip(), flush=True)


def cuda_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def spec_file(gpus: int) -> Path:
    """A spec that maps every host name to GPU_TYPE (what the launcher must report)."""
    spec = {"cluster_type": "local", "cluster_name": "gpu-check", "fileroot": "/tmp/raytrain-gpu-check",
            "cpu_image": "raytrain-cpu", "gpu_image": "raytrain-gpu",
            "gpu_type_from_node_name": {".*": GPU_TYPE}, "node_type_from_node_name": {".*": f"g{gpus}"}}
    path = Path(tempfile.mkdtemp(prefix="raytrain-gpu-check-spec-")) / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def check_selfcheck(gpus: int) -> None:
    argv = [sys.executable, "-m", "runtime", "selfcheck", *(["--require-cuda"] if gpus else [])]
    env = {**os.environ, "CLUSTER_SPEC_PATH": str(spec_file(gpus)), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    last = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
    report("selfcheck", "ok" if r.returncode == 0 else "FAIL", last[0][:200])


def check_launcher(gpus: int) -> None:
    path = spec_file(gpus)
    env = {**os.environ, "RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "1", "RAYTRAIN_HEAD_ADDRESS": "127.0.0.1",
           "RAYTRAIN_GPUS_PER_NODE": str(gpus), "CLUSTER_SPEC_PATH": str(path), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "runtime", "launch", "--no-auth", "--port-base", "24000", "--",
            sys.executable, "-c", "import ray; ray.init(); print('GPUS', ray.cluster_resources().get('GPU', 0))"]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    ident = re.search(r"gpus (\d+), node \S+: node type (\S+), gpu type (\S+)", out)
    seen = re.search(r"GPUS ([\d.]+)", out)
    ok = (r.returncode == 0 and ident and int(ident.group(1)) == gpus and ident.group(3) == (GPU_TYPE if gpus else
          ident.group(3)) and seen and float(seen.group(1)) == gpus)
    detail = (f"launcher said gpus {ident.group(1)}, gpu type {ident.group(3)}; Ray sees {seen.group(1) if seen else '?'} GPU"
              if ident else f"exit {r.returncode}: {out.strip().splitlines()[-1:]}")
    report("launcher", "ok" if ok else "FAIL", detail)


PROBE = textwrap.dedent('''
    import os, time
    import torch

    class Probe:
        def __init__(self, features, batch):
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") != ""
            self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(),
                                        torch.nn.Linear(features, 1)).to(self.device)
            self.model = DDP(model, device_ids=[0] if self.cuda else None)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
            self.x = torch.randn(batch, features, device=self.device)
            self.y = torch.randn(batch, 1, device=self.device)
            self.backend = dist.get_backend()

        def where(self):
            return {"rank": int(os.environ["RANK"]), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "device": str(self.device), "backend": self.backend,
                    "name": torch.cuda.get_device_name(0) if self.cuda else "cpu"}

        def bdd(self, data):
            moved = data.to(self.device)
            return {k: str(v.device) for k, v in moved.items() if hasattr(v, "device")}

        def steps(self, n):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                if self.cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            return times
''')

TORCHRUN = textwrap.dedent('''
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    features, batch, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)  # as a rank in a 1-CPU bundle runs (Ray sets OMP_NUM_THREADS=1)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(),
                                    torch.nn.Linear(features, 1)).to(device), device_ids=[0] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, features, device=device), torch.randn(batch, 1, device=device)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print("TIMES " + json.dumps(times), flush=True)
    dist.destroy_process_group()
''')


def check_group(gpus: int, steps: int) -> None:
    import ray
    import torch

    from runtime.workers.batched import BatchedDataDict
    from runtime.workers.virtual_cluster import RayVirtualCluster
    from runtime.workers.worker_group import RayWorkerGroup
    work = Path(tempfile.mkdtemp(prefix="raytrain-gpu-check-"))
    (work / "gpu_probe.py").write_text(PROBE)
    sys.path.insert(0, str(work))
    import gpu_probe
    ray.init(address="local", num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{work}:{ROOT}"}})
    try:
        cluster = RayVirtualCluster([1], use_gpus=bool(gpus))
        group = RayWorkerGroup(cluster, gpu_probe.Probe, init_kwargs=dict(features=FEATURES, batch=BATCH),
                               memory_limit="16GB")
        where = group.run_all_workers_single_data("where")[0]
        want = "nccl" if gpus else "gloo"
        report("group-device", "ok" if (where["backend"] == want and (not gpus or where["device"].startswith("cuda")))
               else "FAIL", json.dumps(where))
        moved = group.run_all_workers_single_data("bdd", BatchedDataDict({"x": torch.ones(4, 2), "y": torch.zeros(4)}))[0]
        report("batched-to-device", "ok" if set(moved.values()) == {where["device"]} else "FAIL", json.dumps(moved))
        report("memory-limit", "ok" if group.memory_limit in (16 * 10**9, 16 * 2**30) else "FAIL",
               f"a group with memory_limit {group.memory_limit} bytes formed and ran on this device (exceeding it "
               "is covered by tests/test_worker_group_api.py on CPUs)")
        ours = group.run_all_workers_single_data("steps", steps)[0][5:]
        group.shutdown()
        cluster.shutdown()
    finally:
        ray.shutdown()
    script = work / "torchrun_steps.py"
    script.write_text(TORCHRUN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port),
                        str(script), str(FEATURES), str(BATCH), str(steps)], capture_output=True, text=True, timeout=600)
    m = re.search(r"TIMES (\[.*\])", r.stdout)
    if not m:
        report("step-ratio", "FAIL", f"torchrun exited {r.returncode}: {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
        return
    theirs = json.loads(m.group(1))[5:]
    mine, base = statistics.median(ours) * 1000, statistics.median(theirs) * 1000
    report("step-ratio", "ok", f"worker group {mine:.2f} ms/step, torchrun {base:.2f} ms/step on {where['name']}: "
                               f"ratio {mine / base:.3f} (median of {len(ours)} steps each)")


def check_example(gpus: int) -> None:
    if not gpus:
        report("example", "SKIP", "no CUDA device: the tests train the example on CPUs (gloo)")
        return
    fileroot = Path(tempfile.mkdtemp(prefix="raytrain-gpu-check-example-"))
    env = {**os.environ, "RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "1", "RAYTRAIN_HEAD_ADDRESS": "127.0.0.1",
           "RAYTRAIN_GPUS_PER_NODE": str(gpus), "CLUSTER_SPEC_PATH": str(spec_file(gpus)), "PYTHONPATH": str(ROOT),
           "RAYTRAIN_JOB_NAME": "gpu-example", "RAYTRAIN_RUN_ID": "check"}
    argv = [sys.executable, "-m", "runtime", "launch", "--no-auth", "--port-base", "24400", "--",
            sys.executable, str(ROOT / "examples" / "train" / "train.py"), "--steps", "20",
            "--fileroot", str(fileroot)]
    r = subprocess.run(argv, cwd=ROOT / "examples" / "train", capture_output=True, text=True, timeout=900, env=env)
    out = r.stdout + r.stderr
    m = re.search(r"SUMMARY (\{.*\})", out)
    summary = json.loads(m.group(1)) if m else {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    runs = fileroot / "runs" / "gpu-example" / "check"
    ranks = sorted(runs.glob("rank*"))
    steps = []
    for d in ranks:
        acc = EventAccumulator(str(d))
        acc.Reload()
        steps.append([e.step for e in acc.Scalars("loss")] if "loss" in acc.Tags()["scalars"] else [])
    ok = (r.returncode == 0 and summary.get("devices") == ["cuda/nccl"] and ranks
          and all(s == list(range(1, 21)) for s in steps))
    report("example", "ok" if ok else "FAIL", f"exit {r.returncode}, devices {summary.get('devices')}, "
           f"{len(ranks)} rank(s) with event files, steps {[len(s) for s in steps]}"
           + ("" if ok else f"; last lines: {out.strip().splitlines()[-3:]}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="DDP steps timed in each of the two runs (default 50).")
    args = parser.parse_args()
    if args.steps < 6:
        parser.error("--steps: at least 6 (the first 5 of each run are warm-up, not timed)")
    gpus = cuda_count()
    print(f"gpu_check: {gpus} CUDA device(s){'' if gpus else ' (CPU run: the CUDA checks are SKIP)'}", flush=True)
    if gpus:
        import torch
        print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
              flush=True)
    for name, fn in (("selfcheck", lambda: check_selfcheck(gpus)), ("launcher", lambda: check_launcher(gpus)),
                     ("group", lambda: check_group(gpus, args.steps)), ("example", lambda: check_example(gpus))):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one check's failure is its line; the others still run
            report(name, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    if not gpus:
        report("cuda", "SKIP", "no CUDA device here: nccl, CUDA_VISIBLE_DEVICES per rank and the GPU step need one")
    failed = [n for n, st in results if st == "FAIL"]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} checks without failure"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

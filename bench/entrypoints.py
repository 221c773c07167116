"""A torchrun script's time to its first step, three ways, in one run:

  torchrun   PyTorch's own `torchrun --standalone --nproc-per-node 2` of the script on this host (the baseline);
  deploy     `raytrain deploy --target local --torchrun SCRIPT --nproc-per-node 2 --nodes 1`: a fresh node from the
             pushed image, as every deploy starts one;
  held run   `raytrain up --nodes 1`, then a one-line edit of the script and `raytrain run --torchrun SCRIPT
             --nproc-per-node 2` (ranks forked from the node's zygote, torch imported).

The script (written here, CPU, gloo, env://) prints the wall clock when rank 0's first optimizer step is done;
the figure is that minus the moment the command was started (the containers share this host's clock). The
held run is repeated RUNS times (each after its own edit). Target for the held run: under 2 s.

It builds and pushes a scratch copy of the example project with the script in its code (its stages are the
shared `raytrain-*` ones: fast after the README's main command, a cold build otherwise) to a registry of its
own (127.0.0.1:5061), and removes the cluster, its images' tags and the scratch directory at the end.

    .venv/bin/python bench/entrypoints.py [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolchain.docker_client import engine  # noqa: E402

RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
REGISTRY = "127.0.0.1:5061"
SCRIPT = '''import os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
# edit: {edit}
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(16, 32)).sum().backward()
    opt.step()
    if step == 0 and dist.get_rank() == 0:
        print(f"FIRST_STEP {{time.time():.3f}}", flush=True)
dist.destroy_process_group()
'''
FIRST = re.compile(r"FIRST_STEP ([0-9.]+)")


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    t0 = time.time()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    out = res.stdout + res.stderr
    m = FIRST.search(out)
    if res.returncode != 0 or not m:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{out[-3000:]}")
    return float(m.group(1)) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="held runs, each after a one-line edit (default 3)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-entrypoints-"))
    project = scratch / "bench-entry"
    shutil.copytree(ROOT / "examples" / "train", project)
    (project / "ddp.py").write_text(SCRIPT.format(edit=0))
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    # its settings and a spec named for it (images bench-entry-cpu), as a user's project has them
    subprocess.run([RAYTRAIN, "init", "--entry", "ddp.py"], cwd=project, env=env, check=True, capture_output=True)
    with open(project / "raytrain.yaml", "a") as f:
        f.write(f"registry:\n  address: '{REGISTRY}'\n  data_dir: {scratch / 'registry'}\n")
    client = engine()
    rows: dict[str, list[float]] = {}
    print(f"bench: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start", flush=True)
    try:
        subprocess.run([RAYTRAIN, "build", "--variant", "cpu", "--quiet", "push", "--quiet"], cwd=project, env=env,
                       check=True)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "ddp.py"]
        rows["torchrun on this host"] = [timed(torchrun, project, {**env, "OMP_NUM_THREADS": "1"})]
        deploy = [RAYTRAIN, "deploy", "--target", "local", "--nodes", "1", "--torchrun", "ddp.py", "--nproc-per-node",
                  "2", "--quiet"]
        rows["deploy (a fresh node)"] = [timed(deploy, project, env)]
        subprocess.run([RAYTRAIN, "up", "--target", "local", "--nodes", "1", "--quiet"], cwd=project, env=env,
                       check=True)
        held = []
        for i in range(args.runs):
            (project / "ddp.py").write_text(SCRIPT.format(edit=i + 1))  # the one-line edit
            held.append(timed([RAYTRAIN, "run", "--torchrun", "ddp.py", "--nproc-per-node", "2", "--quiet"], project,
                              env))
        rows["held run after a one-line edit"] = held
    finally:
        subprocess.run([RAYTRAIN, "down", "--quiet"], cwd=project, env=env, capture_output=True)
        subprocess.run([RAYTRAIN, "registry.stop"], cwd=project, env=env, capture_output=True)
        for image in client.images.list():
            for tag in image.tags:
                if "bench-entry" in tag:
                    try:
                        client.images.remove(tag, force=True)
                    except Exception:  # noqa: BLE001 - gone already
                        pass
        shutil.rmtree(scratch, ignore_errors=True)
    base = rows["torchrun on this host"][0]
    print(f"{'time to the first step':36} {'seconds':>24} {'ratio to torchrun':>18}")
    for what, times in rows.items():
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(f"{what:36} {shown:>24} {min(times) / base:18.2f}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

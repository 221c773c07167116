"""A script written for torchrun (the tests' own): CPU, gloo, `init_process_group()` with the env://
defaults. Prints one CONTRACT line per rank (torchrun's variables and an all-reduce of rank+1), and exits
3 on rank --fail-rank in the attempts --fail-on lists (TORCHELASTIC_RESTART_COUNT)."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS")

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-on", default="")
args = parser.parse_args()

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
seen = {k: os.environ.get(k) for k in KEYS}
print("CONTRACT " + json.dumps({**seen, "sum": total.item(), "node": os.uname().nodename, "cwd": os.getcwd()}),
      flush=True)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if dist.get_rank() == args.fail_rank and attempt in args.fail_on.split(","):
    print(f"rank {dist.get_rank()} fails on purpose in attempt {attempt}", flush=True)
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()

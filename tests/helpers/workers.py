"""Worker classes used by the worker-group tests (importable by Ray workers via PYTHONPATH)."""
import os
import time

import torch
import torch.distributed as dist


class EnvReporter:
    def __init__(self, tag="a"):
        self.tag = tag

    def env(self):
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "RAYTRAIN_RESTARTS")
        return {k: os.environ.get(k) for k in keys} | {"tag": self.tag, "pid": os.getpid()}

    def allreduce_rank(self):
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item()

    def echo(self, data):
        return data

    def shard_sum(self, batch):
        return {"n": batch.size, "sum": float(batch["x"].sum()), "ids": batch["id"]}

    def crash_if(self, rank):
        if dist.get_rank() == rank:
            print(f"about to crash on rank {rank}", flush=True)
            os._exit(17)
        return "ok"

    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

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


class Checkpointed:
    """Counts steps, checkpoints to a file after each, and resumes from it when (re)started."""

    def __init__(self, path):
        self.path = path
        self.step = int(open(path).read()) if os.path.exists(path) else 0

    def train_step(self):
        self.step += 1
        if dist.get_rank() == 0:
            with open(self.path + ".tmp", "w") as f:
                f.write(str(self.step))
            os.replace(self.path + ".tmp", self.path)
        dist.barrier()
        return self.step

    def pid(self):
        return os.getpid()

    def crash(self):
        os._exit(3)


class Plain:
    """No process group: each worker on its own."""

    def pid(self):
        return os.getpid()

    def crash_on(self, item):
        if item == "boom":
            os._exit(3)
        return item

    def hold(self, mib, seconds=1.0):
        """Hold `mib` MiB of written memory (resident) for a moment."""
        block = bytearray(b"\x01") * (mib * 2**20)
        time.sleep(seconds)
        return len(block) // 2**20

    def crash(self):
        os._exit(3)

    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

    def say(self, n):
        """n numbered lines on stdout and one on stderr, each naming this worker's rank."""
        import sys
        rank = os.environ["RANK"]
        for i in range(n):
            print(f"said {i} by {rank}", flush=True)
        print(f"err said by {rank}", file=sys.stderr, flush=True)
        return n


class DDPWorker:
    def __init__(self):
        from torch.nn.parallel import DistributedDataParallel as DDP
        from runtime.workers.comm_hooks import compress_gradients
        torch.manual_seed(0)
        self.model = DDP(torch.nn.Linear(8, 1))
        self.kind = compress_gradients(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"kind": self.kind, "loss": loss.item(), "w0": self.model.module.weight[0, 0].item()}


def mapping_of(ptr: int) -> str:
    """The /proc/self/maps name of the mapping that holds address ptr ('[heap]', a file, ...)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                return parts[5].strip() if len(parts) > 5 else "(anonymous)"
    return "?"


class DataProbe:
    """Reports where the data it was handed lives and what it holds."""

    def tensor(self, t, scale=1.0):
        return {"mapping": mapping_of(t.data_ptr()), "sum": float(t.float().sum()) * scale, "dtype": str(t.dtype),
                "shape": list(t.shape), "requires_grad": t.requires_grad, "pid": os.getpid()}

    def batch(self, b):
        return {"mapping": mapping_of(b["x"].data_ptr()), "ids": list(b["id"]), "x": b["x"].tolist()}


def own_shard(rank, world_size, n, offset=0):
    """A shard made on the worker itself: ids rank, rank + world_size, ... below n."""
    from runtime.workers.batched import BatchedDataDict
    ids = list(range(rank, n, world_size))
    return BatchedDataDict({"x": torch.tensor([float(i + offset) for i in ids]), "id": ids})

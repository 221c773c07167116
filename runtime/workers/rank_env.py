"""The environment a rank runs with: torch.distributed's variables and where it is. One place, for
both worker-group faces (runtime.workers.worker_group and runtime.nemo_rl)."""
from __future__ import annotations

from runtime.workers.virtual_cluster import BundleSlot


def rank_env(rank: int, world_size: int, slot: BundleSlot, master_addr: str, master_port: int) -> dict:
    env = {"RANK": str(rank), "LOCAL_RANK": str(slot.local_rank), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(slot.local_world_size), "NODE_RANK": str(slot.node_rank),
           "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "NODE_IP": slot.node_ip}
    if slot.gpu_id is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu_id)
    return env

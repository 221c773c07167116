"""Gathering batch values whose row counts differ between ranks (all_gather of a jagged batch)."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist


def _comm_device(tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.device:
    """NCCL moves CUDA tensors only: use this rank's current GPU there, else the tensor's device."""
    if dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return tensor.device


def gather_rows(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Every rank's rows, rank 0's first, on every rank. Dims after the first must agree."""
    device = _comm_device(tensor, group)
    world = dist.get_world_size(group)
    local = tensor.to(device)
    count = torch.tensor([local.shape[0]], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c.item()) for c in counts]
    longest = max(sizes)
    padded = local.new_zeros((longest, *local.shape[1:]))
    padded[:local.shape[0]].copy_(local)
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded.contiguous(), group=group)
    return torch.cat([piece[:n] for piece, n in zip(pieces, sizes)])


def gather_objects(items: list[Any], group: Optional[dist.ProcessGroup] = None) -> list[Any]:
    """Every rank's list items (picklable), rank 0's first, on every rank."""
    lists: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(lists, items, group=group)
    return [item for part in lists for item in part]

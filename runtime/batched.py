"""BatchedDataDict: a dict of equally long batches (tensors or lists) that shards and repeats."""
from __future__ import annotations

from typing import Any, Iterator

import torch


class BatchedDataDict(dict):
    """Every value is a torch.Tensor (batch on dim 0) or a list, all of the same batch size."""

    def __init__(self, data: dict | None = None, **kwargs: Any):
        super().__init__(data or {}, **kwargs)
        self.size  # validates

    @property
    def size(self) -> int:
        sizes = {k: (v.shape[0] if isinstance(v, torch.Tensor) else len(v)) for k, v in self.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"BatchedDataDict values have different batch sizes: {sizes}")
        return next(iter(sizes.values()), 0)

    def _map(self, fn) -> "BatchedDataDict":
        return BatchedDataDict({k: fn(v) for k, v in self.items()})

    def slice(self, start: int, end: int) -> "BatchedDataDict":
        return self._map(lambda v: v[start:end])

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self._map(lambda v: v[key])
        return super().__getitem__(key)

    def shard_by_batch_size(self, shards: int, batch_size: int | None = None) -> list["BatchedDataDict"]:
        """Split into `shards` equal parts; with batch_size, each global batch is split across shards
        (shard i gets the i-th slice of every batch), so data-parallel ranks see disjoint samples."""
        n = self.size
        if shards <= 0:
            raise ValueError(f"shards must be positive, got {shards}")
        batch_size = batch_size or n
        if n % batch_size or batch_size % shards:
            raise ValueError(f"cannot shard {n} samples in batches of {batch_size} over {shards} shards: "
                             f"the total must divide into batches and each batch into shards")
        per = batch_size // shards
        out = []
        for s in range(shards):
            idx = [b + s * per + i for b in range(0, n, batch_size) for i in range(per)]
            out.append(self.select_indices(idx))
        return out

    def chunk(self, rank: int, chunks: int) -> "BatchedDataDict":
        if not 0 <= rank < chunks:
            raise ValueError(f"rank {rank} outside 0..{chunks - 1}")
        n = self.size
        if n % chunks:
            raise ValueError(f"{n} samples do not split into {chunks} equal chunks")
        per = n // chunks
        return self.slice(rank * per, (rank + 1) * per)

    def select_indices(self, idx: list[int]) -> "BatchedDataDict":
        t = torch.tensor(idx, dtype=torch.long)
        return self._map(lambda v: v.index_select(0, t) if isinstance(v, torch.Tensor) else [v[i] for i in idx])

    def repeat_interleave(self, repeats: int) -> "BatchedDataDict":
        return self._map(lambda v: v.repeat_interleave(repeats, dim=0) if isinstance(v, torch.Tensor)
                         else [x for x in v for _ in range(repeats)])

    def make_microbatch_iterator(self, microbatch_size: int) -> Iterator["BatchedDataDict"]:
        if microbatch_size <= 0:
            raise ValueError("microbatch_size must be positive")
        for start in range(0, self.size, microbatch_size):
            yield self.slice(start, start + microbatch_size)

    def to(self, device) -> "BatchedDataDict":
        return self._map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v)

    to_device = to

    @classmethod
    def from_batches(cls, batches: list["BatchedDataDict"]) -> "BatchedDataDict":
        if not batches:
            return cls()
        keys = batches[0].keys()
        return cls({k: torch.cat([b[k] for b in batches]) if isinstance(batches[0][k], torch.Tensor)
                    else [x for b in batches for x in b[k]] for k in keys})

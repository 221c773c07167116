"""Row-level access to the values of a batch: tensors (rows on dim 0), PackedTensors and lists."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import torch

from runtime.workers.batching.packed_tensor import PackedTensor


class BatchShapeError(AssertionError, ValueError):
    """A batch whose rows do not fit the requested split or selection.

    It is an AssertionError because NeMo RL signals these cases with assert statements (and its
    users and tests catch AssertionError), and a ValueError because this runtime raised
    ValueError for them before; either `except` keeps working. Unlike an assert it is raised
    under `python -O` too.
    """


def require(condition: bool, message: str) -> None:
    if not condition:
        raise BatchShapeError(message)


def row_count(value: Any) -> int:
    """Rows in one value: dim 0 of a tensor, logical rows of a PackedTensor, else len()."""
    if torch.is_tensor(value):
        return value.shape[0]
    return len(value)


def uniform_row_count(data: Mapping[Any, Any]) -> int:
    """The common row count of every value; BatchShapeError when they differ (or there are none)."""
    sizes = {row_count(v) for v in data.values()}
    require(len(sizes) == 1, "Batch sizes are not the same across the rollout batch, found sizes: "
                             f"[{','.join(str(s) for s in sorted(sizes))}]")
    return sizes.pop()


def as_index_list(indices: Sequence[int] | torch.Tensor) -> list[int]:
    return indices.tolist() if torch.is_tensor(indices) else [int(i) for i in indices]


def take_rows(value: Any, indices: Sequence[int] | torch.Tensor) -> Any:
    """A new value holding `value`'s rows at `indices`, in that order (copies for tensors)."""
    if torch.is_tensor(value):
        index = torch.as_tensor(indices, dtype=torch.long).to(value.device)
        return value.index_select(0, index)
    if isinstance(value, PackedTensor):
        idx = as_index_list(indices)
        return value.slice(idx) if idx else PackedTensor.empty_rows_like(value, 0)
    if isinstance(value, (list, tuple)):
        return [value[i] for i in as_index_list(indices)]
    raise TypeError(f"Unsupported type {type(value)} for index selection in BatchedDataDict")


def take_range(value: Any, start: int, end: int, key: Any = None) -> Any:
    """Rows start..end-1 of `value` (a view for tensors); a tensor must have `end` rows."""
    if isinstance(value, PackedTensor):
        return value.slice(list(range(start, end))) if end > start else PackedTensor.empty_rows_like(value, 0)
    if torch.is_tensor(value):
        require(end <= value.shape[0],
                f"end: {end} is greater than the shape of the tensor: {value.shape[0]} for key: {key}")
    return value[start:end]


def flatten(groups: Iterable[Sequence[int]]) -> list[int]:
    return [i for group in groups for i in group]

"""Row-level access to the values of a batch: tensors (rows on dim 0), PackedTensors and lists."""
from __future__ import annotations

import operator
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from runtime import numbers
from runtime.errors import InputError
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


def whole(what: str, value: Any, low: int, high: Optional[int] = None) -> int:
    """VALUE as a whole number in [LOW, HIGH] (anything integral: an int, a numpy integer, a 0-d integer
    tensor; not a bool, a float or a string), checked by runtime.numbers; else BatchShapeError naming WHAT."""
    number = None
    if not isinstance(value, (bool, float, str)) and not (torch.is_tensor(value) and value.dtype == torch.bool):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    try:
        if number is None:
            raise InputError(f"{what}: {str(value)[:40]!r} is not a whole number; give an int")
        return numbers.integer(number, what, low, high)
    except InputError as e:
        raise BatchShapeError(str(e)) from None


def indices_within(what: str, indices: Any, size: int) -> list[int]:
    """INDICES as a list of row numbers, each in [0, SIZE), else BatchShapeError naming WHAT and the first bad one."""
    try:
        listed = indices.tolist() if torch.is_tensor(indices) else list(indices)
    except TypeError:
        raise BatchShapeError(f"{what}: {indices!r:.80} is not a sequence of row numbers") from None
    return [whole(f"{what}[{i}]", v, 0, size - 1) if size else whole(f"{what}[{i}] (the batch has no rows)", v, 0, -1)
            for i, v in enumerate(listed)]


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

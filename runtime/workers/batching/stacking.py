"""from_batches: many batches into one, padding token tensors of different lengths."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from runtime.workers.batching.packed_tensor import PackedTensor
from runtime.workers.batching.rows import require, row_count


def _rows_in(batch: Mapping[Any, Any], strict: bool) -> int:
    """A batch's row count. Strict (the default mode) reads only the first value, so values
    without a length (metadata objects) are fine; the lenient mode checks every value agrees."""
    if not batch:
        return 0
    if strict:
        return len(next(iter(batch.values())))
    sizes = {row_count(v) for v in batch.values()}
    if len(sizes) != 1:
        raise ValueError(f"Source batch has inconsistent logical row counts: {sorted(sizes)}.")
    return sizes.pop()


def ordered_keys(batches: Sequence[Mapping[Any, Any]]) -> list[Any]:
    keys = {k: None for b in batches for k in b}
    try:
        return sorted(keys)  # NeMo RL's order
    except TypeError:  # keys that do not compare: first-seen order
        return list(keys)


def _values_for(key: Any, batches: Sequence[Mapping[Any, Any]], rows: list[int], allow_missing_packed: bool,
                ) -> list[Any]:
    """The value of `key` in every batch that has it; a PackedTensor key missing from a non-empty
    batch becomes empty rows there when `allow_missing_packed`, otherwise it is a KeyError."""
    missing = [i for i, b in enumerate(batches) if key not in b and rows[i]]
    if not missing:
        return [b[key] for b in batches if key in b]
    present = [b[key] for b in batches if key in b]
    if not (allow_missing_packed and present and all(isinstance(v, PackedTensor) for v in present)):
        raise KeyError(f"Key {key!r} is missing from non-empty batches {missing}.")
    values = []
    for i, b in enumerate(batches):
        if key in b:
            values.append(b[key])
        elif rows[i]:
            values.append(PackedTensor.empty_rows_like(present[0], rows[i]))
    return values


def _check_packed_rows(key: Any, values: list[PackedTensor], batches: Sequence[Mapping], rows: list[int]) -> None:
    sources = [i for i, b in enumerate(batches) if key in b or rows[i]]
    for n, (i, value) in enumerate(zip(sources, values)):
        if len(value) != rows[i]:
            raise ValueError(f"PackedTensor key {key!r} has {len(value)} logical rows in source batch {n}, "
                             f"expected {rows[i]}.")


def _kind(value: Any) -> str:
    if torch.is_tensor(value):
        return "tensor"
    return "PackedTensor" if isinstance(value, PackedTensor) else type(value).__name__


def stack_values(key: Any, values: list[Any], pad_value: float) -> Any:
    """Lists are joined, PackedTensors concatenated, 1-D tensors concatenated. 2-D tensors are
    right-padded to the longest row; tensors of 3 or more dims are padded on dim 1 (the sequence
    dim) and keep their trailing dims, e.g. top-k logits [B, S, K]."""
    first = values[0]
    kinds = {_kind(v) for v in values}
    require(len(kinds) == 1, f"from_batches: the batches' values for key {str(key)[:80]!r} are of different kinds "
                             f"({', '.join(sorted(kinds))}); give every batch the same kind for a key")
    if isinstance(first, list):
        return [item for v in values for item in v]
    if isinstance(first, PackedTensor):
        return PackedTensor.concat(values)
    if torch.is_tensor(first):
        if all(v.ndim == 1 for v in values):
            return torch.cat(values)
        if first.ndim >= 3:
            longest = max(v.shape[1] for v in values)
            return torch.cat([F.pad(v, [0, 0] * (v.ndim - 2) + [0, longest - v.shape[1]], value=pad_value)
                              for v in values])
        rows = [row.flatten() for v in values for row in v]
        if not rows:  # no rows at all: keep the widest empty shape
            return first.new_zeros((0, max(v.shape[1] if v.ndim > 1 else 0 for v in values)))
        return pad_sequence(rows, batch_first=True, padding_value=pad_value)
    raise NotImplementedError(f"Attempted to stack for unsupported type {type(first)} with key {key}. "
                              "Please provide either a tensor or a list of picklable objects.")


def stack_batches(batches: Sequence[Mapping[Any, Any]], pad_value_dict: Optional[dict] = None,
                  allow_missing_packed_tensors: bool = False) -> dict[Any, Any]:
    """One mapping with every key of `batches`, rows in batch order. A key may be missing only from
    batches without rows (or, with allow_missing_packed_tensors, be a PackedTensor key)."""
    pads = pad_value_dict or {}
    rows = [_rows_in(b, strict=not allow_missing_packed_tensors) for b in batches]
    keys = ordered_keys(batches)
    gathered = {k: _values_for(k, batches, rows, allow_missing_packed_tensors) for k in keys}  # KeyErrors first
    out: dict[Any, Any] = {}
    for k in keys:
        values = gathered[k]
        if allow_missing_packed_tensors and isinstance(values[0], PackedTensor):
            _check_packed_rows(k, values, batches, rows)
        out[k] = stack_values(k, values, pads.get(k, 0))
    return out

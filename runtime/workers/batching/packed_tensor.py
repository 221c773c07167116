"""PackedTensor: a batch value whose rows are variable-size tensor segments (images, videos, audio).

API-compatible with NeMo RL's nemo_rl.data.multimodal_utils.PackedTensor.

Two representations:

* plain: `tensors[i]` is row i (None for a row without this modality). No bookkeeping.
* indexed: rows map onto physical segments through a CSR pair, `_row_offsets` (row r owns the
  references `_row_offsets[r]:_row_offsets[r + 1]`) and `_segment_indices` (reference -> index into
  `tensors`). Several rows may reference the same physical segment, so a prompt's image repeated
  for G generations is stored once.

`_segment_provenance` (one opaque id per physical segment, set by `enable_deduplication`) is what
lets `concat` recognise two references to the same segment: segments with equal provenance are
stored once. Provenance survives deepcopy and pickling; a value-changing `to_dtype` mints new ids.
"""
from __future__ import annotations

import uuid
from copy import deepcopy
from typing import Any, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F

Segments = list[Optional[torch.Tensor]]


def _new_id() -> bytes:
    return uuid.uuid4().bytes


def _check_layout(n_segments: int, offsets: Optional[list[int]], refs: Optional[list[int]],
                  provenance: Optional[list[bytes]]) -> None:
    if (offsets is None) != (refs is None):
        raise ValueError("_row_offsets and _segment_indices must either both be set or both be None")
    if offsets is not None:
        if not offsets or offsets[0] != 0:
            raise ValueError("_row_offsets must start with 0")
        if any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError("_row_offsets must be non-decreasing")
        if offsets[-1] != len(refs):
            raise ValueError("_row_offsets must end at the number of logical segment references")
        if refs and not all(0 <= r < n_segments for r in refs):
            raise ValueError("_segment_indices cannot reference an out-of-range physical segment")
    if provenance is not None and len(provenance) != n_segments:
        raise ValueError("_segment_provenance must have one entry per physical segment")


def _pad_to_common_shape(parts: list[torch.Tensor], pack_dim: int) -> list[torch.Tensor]:
    """Zero-pad every dimension except `pack_dim` up to the largest size among `parts`."""
    ranks = sorted({t.ndim for t in parts})
    if len(ranks) != 1:
        raise ValueError(f"pad_to_max_shape requires tensors with the same rank, but received ranks {ranks}")
    rank = ranks[0]
    dim = pack_dim + rank if pack_dim < 0 else pack_dim
    if not 0 <= dim < rank:
        raise IndexError(f"dim_to_pack={pack_dim} is invalid for tensors with rank {rank}")
    target = [max(t.shape[d] for t in parts) for d in range(rank)]
    padded = []
    for t in parts:
        pad: list[int] = []
        for d in reversed(range(rank)):  # F.pad takes (last dim before, after, previous dim ...)
            pad += [0, 0 if d == dim else target[d] - t.shape[d]]
        padded.append(F.pad(t, pad))
    return padded


class PackedTensor:
    """Rows of tensor segments that `as_tensor` concatenates along `dim_to_pack`."""

    def __init__(self, tensors: Union[torch.Tensor, Segments], dim_to_pack: int, *,
                 pad_to_max_shape: bool = False, _row_offsets: Optional[list[int]] = None,
                 _segment_indices: Optional[list[int]] = None,
                 _segment_provenance: Optional[list[bytes]] = None) -> None:
        if tensors is None:
            raise AssertionError("Input tensors to PackedTensor cannot be None")
        if torch.is_tensor(tensors):
            tensors = [tensors]
        elif not isinstance(tensors, list):
            raise ValueError(f"Unsupported type for input tensors to PackedTensor: {type(tensors)}")
        elif not tensors and _row_offsets is None:
            raise AssertionError("Input tensors to PackedTensor must be a non-empty list")
        _check_layout(len(tensors), _row_offsets, _segment_indices, _segment_provenance)
        self.tensors: Segments = tensors
        self.dim_to_pack = dim_to_pack
        self.pad_to_max_shape = pad_to_max_shape
        self._row_offsets = _row_offsets
        self._segment_indices = _segment_indices
        self._segment_provenance = _segment_provenance

    def __setstate__(self, state: dict[str, Any]) -> None:
        # pickles made before the indexed representation existed lack its three fields
        self.__dict__.update({"_row_offsets": None, "_segment_indices": None, "_segment_provenance": None})
        self.__dict__.update(state)

    # -- representation -------------------------------------------------------------------------
    @property
    def deduplication_enabled(self) -> bool:
        """True once the segments carry provenance (enable_deduplication, or concat of such values)."""
        return self._segment_provenance is not None

    def _is_plain(self) -> bool:
        return self._row_offsets is None and self._segment_provenance is None

    def _with(self, tensors: Segments, offsets: Optional[list[int]], refs: Optional[list[int]],
              provenance: Optional[list[bytes]]) -> "PackedTensor":
        return PackedTensor(tensors, self.dim_to_pack, pad_to_max_shape=self.pad_to_max_shape,
                            _row_offsets=offsets, _segment_indices=refs, _segment_provenance=provenance)

    def _row_segment_indices(self, row: int) -> list[int]:
        if self._row_offsets is None:
            return [row]
        return self._segment_indices[self._row_offsets[row]:self._row_offsets[row + 1]]

    def __len__(self) -> int:
        return len(self.tensors) if self._row_offsets is None else len(self._row_offsets) - 1

    def __repr__(self) -> str:
        return (f"PackedTensor(rows={len(self)}, segments={len(self.tensors)}, dim_to_pack={self.dim_to_pack}, "
                f"deduplication={self.deduplication_enabled})")

    def enable_deduplication(self) -> "PackedTensor":
        """Give every physical segment a provenance id (once); returns self."""
        if self._segment_provenance is None:
            self._segment_provenance = [_new_id() for _ in self.tensors]
        return self

    def logical_segment_counts_by_row(self) -> list[int]:
        """How many non-None segments each row holds."""
        return [sum(self.tensors[i] is not None for i in self._row_segment_indices(r)) for r in range(len(self))]

    def iter_logical_segments(self) -> Iterator[Optional[torch.Tensor]]:
        """The segments in row order, a shared segment once per reference."""
        if self._segment_indices is None:
            yield from self.tensors
        else:
            for i in self._segment_indices:
                yield self.tensors[i]

    # -- values ----------------------------------------------------------------------------------
    def as_tensor(self, device: Optional[Union[str, torch.device]] = None) -> Optional[torch.Tensor]:
        """All segments concatenated along dim_to_pack (None when no row has one). With `device`,
        the segments themselves are moved there first."""
        if device is not None:
            self.to(device)
        parts = [t for t in self.iter_logical_segments() if t is not None]
        if not parts:
            return None
        if self.pad_to_max_shape:
            parts = _pad_to_common_shape(parts, self.dim_to_pack)
        return torch.cat(parts, dim=self.dim_to_pack)

    def to(self, device: Union[str, torch.device]) -> "PackedTensor":
        """Move the segments, in place (provenance stays: the values are unchanged); returns self."""
        self.tensors = [t.to(device) if t is not None else None for t in self.tensors]
        return self

    def to_dtype(self, dtype: torch.dtype) -> "PackedTensor":
        """A new wrapper with floating-point segments cast to `dtype` (integer metadata such as grid
        sizes is left alone). Row mapping is kept; cast segments get new provenance."""
        changes = any(t is not None and t.is_floating_point() and t.dtype != dtype for t in self.tensors)
        if changes:
            tensors = [t.to(dtype=dtype) if t is not None and t.is_floating_point() else t for t in self.tensors]
        else:
            tensors = list(self.tensors)
        provenance = self._segment_provenance
        if provenance is not None:
            provenance = [_new_id() for _ in tensors] if changes else list(provenance)
        return self._with(tensors, _copy(self._row_offsets), _copy(self._segment_indices), provenance)

    def __deepcopy__(self, memo: dict[int, Any]) -> "PackedTensor":
        # Segments of a deduplicated value are immutable by contract and stay shared; the wrapper
        # and its bookkeeping lists are always new.
        tensors = list(self.tensors) if self.deduplication_enabled else [deepcopy(t, memo) for t in self.tensors]
        copied = self._with(tensors, _copy(self._row_offsets), _copy(self._segment_indices),
                            _copy(self._segment_provenance))
        memo[id(self)] = copied
        return copied

    # -- row selection and combination ------------------------------------------------------------
    def slice(self, indices: Union[Sequence[int], torch.Tensor]) -> "PackedTensor":
        """The rows at `indices`, in that order. An indexed/deduplicated value keeps only the
        segments those rows reference (each once, in first-use order)."""
        rows = indices.tolist() if torch.is_tensor(indices) else list(indices)
        if self._is_plain():
            if not rows:
                return PackedTensor.empty_rows_like(self, 0)
            return self._with([self.tensors[r] for r in rows], None, None, None)
        n = len(self)
        kept: dict[int, int] = {}
        tensors: Segments = []
        refs: list[int] = []
        offsets = [0]
        for row in rows:
            row = row + n if row < 0 else row
            if not 0 <= row < n:
                raise IndexError(f"PackedTensor row index {row} is out of range")
            for seg in self._row_segment_indices(row):
                if seg not in kept:
                    kept[seg] = len(tensors)
                    tensors.append(self.tensors[seg])
                refs.append(kept[seg])
            offsets.append(len(refs))
        provenance = None
        if self._segment_provenance is not None:
            provenance = [self._segment_provenance[seg] for seg in kept]  # dicts keep insertion order
        return self._with(tensors, offsets, refs, provenance)

    @classmethod
    def empty_like(cls, other: "PackedTensor") -> "PackedTensor":
        return cls.empty_rows_like(other, len(other))

    @classmethod
    def empty_rows_like(cls, other: "PackedTensor", num_rows: int) -> "PackedTensor":
        """`num_rows` rows without segments, in `other`'s representation and settings."""
        if num_rows < 0:
            raise ValueError("num_rows must be non-negative")
        kw = dict(pad_to_max_shape=other.pad_to_max_shape)
        if not other._is_plain():
            return cls([], other.dim_to_pack, _row_offsets=[0] * (num_rows + 1), _segment_indices=[],
                       _segment_provenance=[], **kw)
        if num_rows == 0:
            return cls([], other.dim_to_pack, _row_offsets=[0], _segment_indices=[], **kw)
        return cls([None] * num_rows, other.dim_to_pack, **kw)

    @classmethod
    def concat(cls, from_packed_tensors: list["PackedTensor"]) -> "PackedTensor":
        """The rows of every input, in order. Plain inputs give a plain result (the segment lists
        joined); if any input is indexed or deduplicated, the result is indexed and segments with
        equal provenance are stored once."""
        parts = list(from_packed_tensors)
        if not parts:
            raise ValueError("PackedTensor.concat needs at least one PackedTensor")
        if len({p.dim_to_pack for p in parts}) != 1:
            raise AssertionError("All packed tensors must have the same dim_to_pack")
        if len({p.pad_to_max_shape for p in parts}) != 1:
            raise AssertionError("All packed tensors must have the same pad_to_max_shape setting")
        first = parts[0]
        if all(p._is_plain() for p in parts):
            return first._with([t for p in parts for t in p.tensors], None, None, None)
        tensors: Segments = []
        provenance: list[bytes] = []
        slot_of: dict[bytes, int] = {}
        refs: list[int] = []
        offsets = [0]
        for p in parts:
            local = []  # p's segment index -> index in the result
            for i, t in enumerate(p.tensors):
                pid = p._segment_provenance[i] if p._segment_provenance is not None else None
                if pid is None or pid not in slot_of:
                    pid = _new_id() if pid is None else pid
                    slot_of[pid] = len(tensors)
                    tensors.append(t)
                    provenance.append(pid)
                local.append(slot_of[pid])
            for row in range(len(p)):
                refs.extend(local[i] for i in p._row_segment_indices(row))
                offsets.append(len(refs))
        return first._with(tensors, offsets, refs, provenance)

    @classmethod
    def merge_segments(cls, from_packed_tensors: list["PackedTensor"]) -> "PackedTensor":
        """Combine per-turn values of one conversation. Indexed/deduplicated inputs collapse into a
        single row holding every segment; plain inputs are concatenated (one row per segment)."""
        merged = cls.concat(from_packed_tensors)
        if merged._row_offsets is None:
            return merged
        return merged._with(merged.tensors, [0, len(merged._segment_indices)], merged._segment_indices,
                            merged._segment_provenance)

    @classmethod
    def flattened_concat(cls, from_packed_tensors: list["PackedTensor"]) -> "PackedTensor":
        """One row per input: a plain input is first flattened with as_tensor(); indexed inputs
        must already be single rows."""
        parts = list(from_packed_tensors)
        if all(p._is_plain() for p in parts):
            if len({p.dim_to_pack for p in parts}) != 1:
                raise AssertionError("All packed tensors must have the same dim_to_pack")
            if len({p.pad_to_max_shape for p in parts}) != 1:
                raise AssertionError("All packed tensors must have the same pad_to_max_shape setting")
            return parts[0]._with([p.as_tensor() for p in parts], None, None, None)
        if any(len(p) != 1 for p in parts):
            raise AssertionError("flattened_concat requires one logical row per input; "
                                 "merge_segments only collapses dedup-enabled values")
        return cls.concat(parts)


def _copy(values: Optional[list]) -> Optional[list]:
    return None if values is None else list(values)

"""BatchedDataDict: a dict of batch values (tensors with rows on dim 0, PackedTensors, lists) that
shards, slices, repeats, stacks and micro-batches.

The behaviour and API are those of NeMo RL's nemo_rl.distributed.batched_data_dict (so code that
only changes its imports behaves the same), on a dict subclass so that it pickles like a dict and
runtime.workers.transfer recognises it. Differences, all additive: `d[a:b]` slices rows, `to_device` is an
alias of `to`, the errors NeMo RL raises with `assert` are BatchShapeError (both an AssertionError
and a ValueError, and raised under `python -O` too), and `chunk` accepts every rank below `chunks`.
The algorithms live in runtime.workers.batching.
"""
from __future__ import annotations

from copy import deepcopy
from typing import Any, Generic, Iterator, Mapping, Optional, Sequence, TypeVar, Union

import torch

from runtime.workers.batching import collectives, plans
from runtime.workers.batching.args import DynamicBatchingArgs, SequencePackingArgs
from runtime.workers.batching.media import NATIVE_MULTIMODAL_KEYS, PIXEL_KEYS, check_coupled_media, shared_media_memo
from runtime.workers.batching.packed_tensor import PackedTensor
from runtime.workers.batching.rows import (BatchShapeError, as_index_list, indices_within, require, take_range,
                                           take_rows, uniform_row_count, whole)
from runtime.workers.batching.stacking import ordered_keys, stack_batches

__all__ = ["BatchedDataDict", "SlicedDataDict", "DynamicBatchingArgs", "SequencePackingArgs", "PackedTensor",
           "BatchShapeError"]

DictT = TypeVar("DictT", bound=Mapping[str, Any])
B = TypeVar("B", bound="BatchedDataDict")
Indices = Union[Sequence[int], torch.Tensor]


class BatchedDataDict(dict, Generic[DictT]):
    """Values share a row count (not checked on construction, as in NeMo RL: sharding checks it).

    Micro-batch plans made by shard_by_batch_size ride along as attributes: `micro_batch_indices`
    and `micro_batch_lengths` (per global batch, the [start, end) row spans and padded lengths of
    its micro-batches) and, for sequence packing, `elem_counts_per_gb` (rows per global batch).
    """

    # keys model code needs next to the PackedTensors (not media themselves)
    ADDITIONAL_OPTIONAL_KEY_TENSORS = ["token_type_ids", "mm_token_type_ids"]
    micro_batch_indices: Optional[list] = None
    micro_batch_lengths: Optional[list] = None
    elem_counts_per_gb: Optional[list] = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.micro_batch_indices = None
        self.micro_batch_lengths = None
        self.elem_counts_per_gb = None

    # -- dict-level ---------------------------------------------------------------------------------
    @property
    def data(self) -> "BatchedDataDict":
        """The mapping itself (NeMo RL's BatchedDataDict is a UserDict; `.data` is its dict)."""
        return self

    def get_dict(self) -> "BatchedDataDict":
        """The underlying mapping: this object (it is a dict), so changes to it change the batch."""
        return self

    def copy(self: B) -> B:
        out = type(self)(self)
        out.__dict__.update(self.__dict__)
        return out

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):  # d[a:b] -> rows a..b-1 of every value
            return self._with_values(lambda v: v.slice(list(range(len(v)))[key]) if isinstance(v, PackedTensor)
                                     else v[key])
        return super().__getitem__(key)

    def _with_values(self, fn, cls: Optional[type] = None) -> "BatchedDataDict":
        return (cls or type(self))({k: fn(v) for k, v in self.items()})

    def _rows(self, indices: Indices, cls: Optional[type] = None) -> "BatchedDataDict":
        return self._with_values(lambda v: take_rows(v, indices), cls)

    @property
    def size(self) -> int:
        """Rows in the batch, read from the first value (0 when empty)."""
        if not self:
            return 0
        first = next(iter(self.values()))
        return first.shape[0] if torch.is_tensor(first) else len(first)

    def to(self: B, device: Union[str, torch.device]) -> B:
        """Move tensors and PackedTensors to `device`, in place; returns self."""
        for k, v in self.items():
            if torch.is_tensor(v) or isinstance(v, PackedTensor):
                self[k] = v.to(device)
        return self

    to_device = to

    # -- combining ----------------------------------------------------------------------------------
    @classmethod
    def from_batches(cls: type[B], batches: Sequence[Mapping[Any, Any]], pad_value_dict: Optional[dict] = None,
                     *, allow_missing_packed_tensors: bool = False) -> B:
        """Stack batches: lists joined, PackedTensors concatenated, tensors concatenated on dim 0
        after padding their sequence dim to the longest (with pad_value_dict[key], default 0).
        Keys come out sorted. A key may be missing only from batches with no rows, or, with
        allow_missing_packed_tensors, be a PackedTensor key (then those rows get no media)."""
        if not batches:
            return cls()
        return cls(stack_batches(batches, pad_value_dict, allow_missing_packed_tensors))

    def all_gather(self: B, group: Optional[torch.distributed.ProcessGroup]) -> B:
        """Every rank's rows (rank order) of every value, on every rank of `group`. Tensors may
        have different row counts per rank; lists hold picklable items."""
        out = type(self)()
        for k, v in self.items():
            if torch.is_tensor(v):
                out[k] = collectives.gather_rows(v, group)
            elif isinstance(v, list):
                out[k] = collectives.gather_objects(v, group)
            else:
                raise NotImplementedError(f"Attempted to gather_and_balance_globally for unsupported type {type(v)} "
                                          f"with key {k}. Please provide either a tensor or a list of picklable objects.")
        return out

    # -- selecting rows -----------------------------------------------------------------------------
    def slice(self, start: int, end: int) -> "SlicedDataDict":
        """Rows start..end-1 (tensor values are views; a tensor must have `end` rows). Every value must
        have the same number of rows (BatchShapeError), or the slices would not line up."""
        total = uniform_row_count(self) if self else 0
        start = whole("slice start", start, 0)
        end = whole("slice end", end, start)
        require(end <= total, f"end: {end} is greater than the shape of the batch: {total} rows")  # NeMo RL's words
        return SlicedDataDict({k: take_range(v, start, end, k) for k, v in self.items()})

    def select_indices(self: B, indices: Indices) -> B:
        """Rows at `indices`, in that order (every value with the same number of rows)."""
        total = uniform_row_count(self) if self else 0
        return self._rows(indices_within("select_indices", indices, total))

    def chunk(self, rank: int, chunks: int) -> "SlicedDataDict":
        """Split into `chunks` equal consecutive parts and return part `rank` (tensors copied)."""
        total = uniform_row_count(self)
        chunks, rank = whole("chunks", chunks, 1), whole("rank", rank, 0)
        require(total % chunks == 0, f"batch size ({total}) is not a multiple of chunks ({chunks})")
        require(0 <= rank < chunks, f"index OOB: not enough splits for this rank. rollout_batch_size: {total}, "
                                    f"chunks ({chunks}), rank_idx ({rank})")
        per = total // chunks
        return self._rows(range(rank * per, (rank + 1) * per), SlicedDataDict)

    def reorder_data(self, reorded_indices: Sequence[int]) -> None:
        """Undo a shuffle in place: the row now at position p came from position reorded_indices[p]
        (what shard_by_batch_size returns for dynamic batching and sequence packing)."""
        total = uniform_row_count(self)
        given = indices_within("reorder_data", reorded_indices, total)
        require(sorted(given) == list(range(total)), f"reorder_data: the indices are not each row number 0-{total - 1} "
                                                     "once (a repeated or missing row would be lost)")
        order = sorted(range(len(given)), key=lambda p: given[p])
        for k, v in list(self.items()):
            self[k] = take_rows(v, order)

    def get_batch(self, batch_idx: int, batch_size: Optional[int] = None) -> "SlicedDataDict":
        """Global batch `batch_idx` of a shard, with its micro-batch plan. Sequence-packed shards
        know each global batch's row count; otherwise pass batch_size (rows per global batch)."""
        batch_idx = whole("batch_idx", batch_idx, 0)
        if self.elem_counts_per_gb is not None:
            require(self.micro_batch_indices is not None, "micro_batch_indices must be provided if sequence_packing is True")
            require(batch_idx < len(self.elem_counts_per_gb), f"batch_idx: {batch_idx}, but the shard has "
                                                              f"{len(self.elem_counts_per_gb)} global batch(es)")
            start = sum(self.elem_counts_per_gb[:batch_idx])
            batch = self.slice(start, start + self.elem_counts_per_gb[batch_idx])
            batch.elem_counts_per_gb = [self.elem_counts_per_gb[batch_idx]]
        else:
            if batch_size is None:
                raise TypeError("get_batch needs batch_size unless the batch was sequence-packed")
            batch_size = whole("batch_size", batch_size, 1)
            total = uniform_row_count(self) if self else 0
            require(batch_size * (batch_idx + 1) <= total, f"get_batch: batch {batch_idx} of {batch_size} rows ends at "
                                                           f"row {batch_size * (batch_idx + 1)}, past the {total} rows")
            batch = self.slice(batch_size * batch_idx, batch_size * (batch_idx + 1))
        if self.micro_batch_indices is not None:
            batch.micro_batch_indices = [self.micro_batch_indices[batch_idx]]
            batch.micro_batch_lengths = [self.micro_batch_lengths[batch_idx]]
        return batch

    # -- sharding -----------------------------------------------------------------------------------
    def shard_by_batch_size(
        self, shards: int, batch_size: Optional[int] = None, allow_uneven_shards: bool = False,
        dynamic_batching_args: Optional[DynamicBatchingArgs] = None,
        sequence_packing_args: Optional[SequencePackingArgs] = None,
    ) -> Union[list["SlicedDataDict"], tuple[list["SlicedDataDict"], list[int]]]:
        """Split over `shards` data-parallel ranks, one global batch (`batch_size` rows, default
        all) at a time: shard s gets the s-th consecutive piece of every global batch, so each rank
        steps through the global batches in order. E.g. ids [0..7], shards=2, batch_size=4 ->
        [0, 1, 4, 5] and [2, 3, 6, 7].

        allow_uneven_shards (only without batch_size): pieces of ceil(rows / shards) rows, the last
        ones short or empty (empty shards keep every key). With dynamic_batching_args or
        sequence_packing_args the rows are reordered (see runtime.workers.batching.plans), the shards carry
        their micro-batch plans, and the return value is (shards, order), where `order` is what
        reorder_data takes to restore the original row order of the re-stacked shards.
        """
        require(not (allow_uneven_shards and batch_size is not None),
                "batch_size must be None if allow_uneven_shards is True")
        require(dynamic_batching_args is None or sequence_packing_args is None,
                "dynamic_batching_args and sequence_packing_args cannot be passed together")
        require(shards > 0, f"shards must be positive, got {shards}")
        total = uniform_row_count(self)
        batch_size = total if batch_size is None else batch_size
        require((batch_size > 0 and total % batch_size == 0) or total == batch_size == 0,
                f"Total batch size ({total}) is not a multiple of batch_size ({batch_size})")
        if not allow_uneven_shards:
            require(batch_size % shards == 0, f"Batch size ({batch_size}) is not a multiple of shards ({shards})")

        if sequence_packing_args is not None:
            lengths = as_index_list(self[sequence_packing_args["input_lengths_key"]])
            plan = plans.packing_plan(lengths, batch_size, shards, sequence_packing_args)
            keys = ordered_keys([self])  # NeMo RL re-stacks packed shards, which sorts their keys
            out = [SlicedDataDict({k: take_rows(self[k], rows) for k in keys}) for rows in plan.rows]
            for s, shard in enumerate(out):
                shard.micro_batch_indices = plan.spans[s]
                shard.micro_batch_lengths = plan.tokens[s]
                shard.elem_counts_per_gb = plan.rows_per_chunk[s]
            return out, plan.order

        rows = plans.even_shard_rows(total, batch_size, shards, allow_uneven_shards)
        if dynamic_batching_args is None:
            return [self._rows(r, SlicedDataDict) for r in rows]

        args = dynamic_batching_args
        lengths = as_index_list(self[args["input_lengths_key"]])
        order = plans.length_sorted_order(lengths, batch_size, shards)
        shard_rows = [[order[r] for r in rs] for rs in rows]
        out = [self._rows(rs, SlicedDataDict) for rs in shard_rows]
        spans, seq_lengths = plans.dynamic_microbatches(
            [[lengths[i] for i in rs] for rs in shard_rows], chunks=total // batch_size if batch_size else 0,
            per_chunk=-(-batch_size // shards), round_to=args["sequence_length_round"],
            width=self[args["input_key"]].shape[1], max_tokens=args["max_tokens_per_microbatch"])
        for shard in out:
            shard.micro_batch_indices = spans
            shard.micro_batch_lengths = seq_lengths
        return out, order

    # -- repeating and trimming ---------------------------------------------------------------------
    def repeat_interleave(self: B, num_repeats: int, *, share_immutable_media: bool = False) -> B:
        """Each row `num_repeats` times in a row ([a, b] -> [a, a, b, b]). List rows are deep
        copies, so repeats can be changed independently; with share_immutable_media the copies
        share their media (PackedTensor segments, vllm_* payloads, image/video/audio content
        parts) while every container is still new. PackedTensor values cannot be repeated."""
        num_repeats = whole("num_repeats", num_repeats, 0)
        if self:
            uniform_row_count(self)
        out = type(self)()
        for k, v in self.items():
            if torch.is_tensor(v):
                out[k] = v.repeat_interleave(num_repeats, dim=0)
            elif isinstance(v, PackedTensor):
                raise NotImplementedError("PackedTensor does not currently support repeat_interleave")
            else:
                repeated = []
                for item in v:
                    memo = shared_media_memo(item, k in NATIVE_MULTIMODAL_KEYS) if share_immutable_media else {}
                    repeated.extend(deepcopy(item, dict(memo)) for _ in range(num_repeats))
                out[k] = repeated
        return out

    def truncate_tensors(self, dim: int, truncated_len: int) -> None:
        """In place: every tensor with a dim `dim` keeps only its first truncated_len entries there."""
        for k, v in list(self.items()):
            if torch.is_tensor(v) and v.ndim > dim:
                self[k] = v.narrow(dim, 0, truncated_len)

    # -- micro-batches ------------------------------------------------------------------------------
    def make_microbatch_iterator(self, microbatch_size: int) -> Iterator["SlicedDataDict"]:
        """Consecutive micro-batches of microbatch_size rows; the size must divide the batch."""
        total = uniform_row_count(self) if self else 0
        require(microbatch_size > 0 and total % microbatch_size == 0,
                f"Data dict size ({total}) is not a multiple of the provided microbatch size ({microbatch_size})")
        for start in range(0, total, microbatch_size):
            yield self.slice(start, start + microbatch_size)

    def _single_plan(self) -> tuple[list, list]:
        require(self.micro_batch_indices is not None and self.micro_batch_lengths is not None
                and len(self.micro_batch_indices) == 1,
                "needs the micro-batch plan of exactly one global batch (shard_by_batch_size, then get_batch)")
        return self.micro_batch_indices[0], self.micro_batch_lengths[0]

    def make_microbatch_iterator_with_dynamic_shapes(self, sequence_dim: int = 1) -> Iterator["SlicedDataDict"]:
        """Dynamic batching's micro-batches, each truncated on `sequence_dim` to its planned length."""
        spans, lengths = self._single_plan()
        for (start, end), seqlen in zip(spans, lengths):
            mb = self.slice(start, end)
            mb.truncate_tensors(dim=sequence_dim, truncated_len=seqlen)
            yield mb

    def get_microbatch_iterator_dynamic_shapes_len(self) -> int:
        return len(self.micro_batch_indices[0])

    def make_microbatch_iterator_for_packable_sequences(self) -> Iterator["SlicedDataDict"]:
        """Sequence packing's micro-batches (one bin each), untruncated."""
        spans, _ = self._single_plan()
        for start, end in spans:
            yield self.slice(start, end)

    def get_microbatch_iterator_for_packable_sequences_len(self) -> tuple[int, int]:
        """(number of micro-batches, largest packed length)."""
        return len(self.micro_batch_indices[0]), max(self.micro_batch_lengths[0])

    # -- multimodal ---------------------------------------------------------------------------------
    def get_multimodal_dict(self, as_tensors: bool = False, device: Optional[torch.device] = None,
                            pixel_dtype: Optional[torch.dtype] = None) -> dict[str, Any]:
        """The model's multimodal inputs: every PackedTensor value (concatenated with as_tensor()
        when as_tensors, on `device`) and the ADDITIONAL_OPTIONAL_KEY_TENSORS. pixel_dtype casts
        the pixel keys without expanding shared segments."""
        if as_tensors:
            check_coupled_media(self)
        out: dict[str, Any] = {}
        for k, v in self.items():
            if isinstance(v, PackedTensor):
                if pixel_dtype is not None and k in PIXEL_KEYS:
                    v = v.to_dtype(pixel_dtype)
                out[k] = v.as_tensor(device=device) if as_tensors else v
            elif k in self.ADDITIONAL_OPTIONAL_KEY_TENSORS:
                out[k] = v
        return out


class SlicedDataDict(BatchedDataDict):
    """A shard or slice of a larger batch (a distinct type for readers and type checkers)."""

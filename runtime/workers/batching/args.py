"""The TypedDicts that switch BatchedDataDict.shard_by_batch_size into dynamic batching or
sequence packing (field names as in NeMo RL's batched_data_dict)."""
from __future__ import annotations

from typing import Literal, TypedDict

try:
    from typing import NotRequired
except ImportError:  # Python 3.10
    from typing_extensions import NotRequired


class SequencePackingArgs(TypedDict):
    """Pack whole sequences into micro-batches of at most `max_tokens_per_microbatch` tokens."""

    max_tokens_per_microbatch: int
    input_key: str  # the token tensor, [batch, seq]
    input_lengths_key: str  # each row's sequence length
    algorithm: str  # a runtime.workers.batching.packing.PackingAlgorithm name, e.g. "modified_first_fit_decreasing"
    # per shard: run the bins in the packer's order (default) or the fullest bin first
    microbatch_order: NotRequired[Literal["packer", "largest_first"]]
    sequence_length_pad_multiple: int  # each length is rounded up to this (context/tensor-parallel alignment)


class DynamicBatchingArgs(TypedDict):
    """Group length-sorted rows into micro-batches whose padded size stays within a token budget."""

    max_tokens_per_microbatch: int  # rows x padded length of a micro-batch
    sequence_length_round: int  # each micro-batch's length is rounded up to this multiple
    input_key: str  # the token tensor, [batch, seq]; its width caps the rounded length
    input_lengths_key: str  # each row's sequence length

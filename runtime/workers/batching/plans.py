"""Which rows each shard gets, and how a shard's rows group into micro-batches.

Plans are lists of row indices; runtime.workers.batched turns them into data. Three modes, as in NeMo RL's
shard_by_batch_size:

* even: the batch is cut into chunks of `batch_size` rows (global batches) and every chunk into
  `shards` consecutive pieces; shard s gets piece s of every chunk.
* dynamic batching: within every chunk, rows are sorted by length and dealt round-robin to the
  shards (so ranks get similar lengths), then cut as above; micro-batches are runs of positions
  whose (rows x longest rounded length, taken over all shards) fits the token budget.
* sequence packing: every chunk's (padded) lengths are bin-packed; bin k goes to shard k % shards
  and each bin is one micro-batch.
"""
from __future__ import annotations

from typing import Optional, Sequence

from runtime.workers.batching.args import SequencePackingArgs
from runtime.workers.batching.packing import get_packer
from runtime.workers.batching.rows import require

Spans = list[list[int]]  # [start, end) row ranges, one per micro-batch


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def even_shard_rows(total: int, batch_size: int, shards: int, uneven: bool) -> list[list[int]]:
    """Rows of each shard; with `uneven` a piece has ceil(batch_size / shards) rows and the last
    pieces may be short or empty."""
    piece = -(-batch_size // shards) if uneven else batch_size // shards
    chunks = total // batch_size if batch_size else 0
    out: list[list[int]] = []
    for s in range(shards):
        rows: list[int] = []
        for c in range(chunks):
            start = min(c * batch_size + s * piece, total)
            rows.extend(range(start, min(start + piece, total, (c + 1) * batch_size)))
        out.append(rows)
    return out


def length_sorted_order(lengths: Sequence[int], batch_size: int, shards: int) -> list[int]:
    """Per chunk: row indices sorted by length (ties keep order), dealt round-robin to the shards,
    then shard 0's rows, shard 1's rows, ... (the order dynamic batching shards in)."""
    order: list[int] = []
    for base in range(0, len(lengths), batch_size or 1):
        ranked = sorted(range(base, base + batch_size), key=lambda i: lengths[i])
        for s in range(shards):
            order.extend(ranked[s::shards])
    return order


def dynamic_microbatches(shard_lengths: list[list[int]], chunks: int, per_chunk: int, round_to: int,
                         width: int, max_tokens: int) -> tuple[list[Spans], list[list[int]]]:
    """Per chunk, the micro-batch spans and padded lengths shared by all shards. Position p's
    length is the longest row at p over the shards, rounded up to `round_to` and capped at `width`
    (the padded tensor's sequence dim); a micro-batch grows while rows x its longest length fits."""
    all_spans: list[Spans] = []
    all_lengths: list[list[int]] = []
    for c in range(chunks):
        spans: Spans = [[0, 0]]
        lengths = [0]
        longest = 0
        for p in range(per_chunk):
            row = c * per_chunk + p
            need = max((ls[row] for ls in shard_lengths if row < len(ls)), default=0)
            need = min(round_up(need, round_to), width)
            require(need <= max_tokens, f"got an input of padded ({round_to}) sequence length of {need}, "
                                        f"however max microbatch size is {max_tokens} tokens")
            longest = max(longest, need)
            if (spans[-1][1] - spans[-1][0] + 1) * longest <= max_tokens:
                spans[-1][1] += 1
                lengths[-1] = longest
            else:
                spans.append([p, p + 1])
                longest = need
                lengths.append(need)
        all_spans.append(spans)
        all_lengths.append(lengths)
    return all_spans, all_lengths


class PackingPlan:
    """Per shard: its rows (in order), and per chunk its micro-batch spans (relative to the
    chunk's first row in the shard), their padded token counts and the chunk's row count."""

    def __init__(self, shards: int):
        self.rows: list[list[int]] = [[] for _ in range(shards)]
        self.spans: list[list[Spans]] = [[] for _ in range(shards)]
        self.tokens: list[list[list[int]]] = [[] for _ in range(shards)]
        self.rows_per_chunk: list[list[int]] = [[] for _ in range(shards)]

    @property
    def order(self) -> list[int]:
        """All rows, shard after shard: what reorder_data takes to restore the original order."""
        return [i for rows in self.rows for i in rows]


def packing_plan(lengths: Sequence[int], batch_size: int, shards: int, args: SequencePackingArgs) -> PackingPlan:
    mb_order: Optional[str] = args.get("microbatch_order")
    if mb_order not in (None, "packer", "largest_first"):
        raise ValueError(f"sequence packing microbatch_order must be 'packer' or 'largest_first', got {mb_order!r}")
    packer = get_packer(args["algorithm"], args["max_tokens_per_microbatch"], min_bin_count=shards,
                        bin_count_multiple=shards)
    multiple = args["sequence_length_pad_multiple"]
    padded = [round_up(int(n), multiple) for n in lengths]
    plan = PackingPlan(shards)
    for base in range(0, len(padded), batch_size or 1):
        bins = [[base + i for i in b] for b in packer.pack(padded[base:base + batch_size])]
        for s in range(shards):
            mine = bins[s::shards]  # the packer's round-robin bin -> rank assignment is kept
            if mb_order == "largest_first":
                mine = sorted(mine, key=lambda b: sum(padded[i] for i in b), reverse=True)
            spans: Spans = []
            for b in mine:
                start = spans[-1][1] if spans else 0
                spans.append([start, start + len(b)])
                plan.rows[s].extend(b)
            plan.spans[s].append(spans)
            plan.tokens[s].append([sum(padded[i] for i in b) for b in mine])
            plan.rows_per_chunk[s].append(spans[-1][1] if spans else 0)
    return plan

"""Bin packing of sequence lengths into micro-batches of at most `bin_capacity` tokens.

The algorithms and their names follow NeMo RL's nemo_rl.data.packing, so the same configuration
gives the same bins: "concatenative", "first_fit_decreasing", "first_fit_shuffle" and
"modified_first_fit_decreasing" (Johnson & Garey's MFFD). A bin is a list of indices into the
lengths; `pack` then splits bins until there are at least `min_bin_count` of them and their number
is a multiple of `bin_count_multiple` (so every data-parallel rank gets the same number).
"""
from __future__ import annotations

import bisect
import enum
import random
from typing import Optional, Sequence, Union

Bins = list[list[int]]


class PackingAlgorithm(enum.Enum):
    CONCATENATIVE = "concatenative"
    FIRST_FIT_DECREASING = "first_fit_decreasing"
    FIRST_FIT_SHUFFLE = "first_fit_shuffle"
    MODIFIED_FIRST_FIT_DECREASING = "modified_first_fit_decreasing"


def _check_fit(lengths: Sequence[int], capacity: int) -> None:
    for n in lengths:
        if n > capacity:
            raise ValueError(f"Sequence length {n} exceeds bin capacity {capacity}")


def concatenative(lengths: Sequence[int], capacity: int) -> Bins:
    """In order, starting a new bin whenever the next sequence would overflow the current one."""
    _check_fit(lengths, capacity)
    bins: Bins = []
    load = capacity + 1  # forces a first bin
    for i, n in enumerate(lengths):
        if not bins or load + n > capacity:
            bins.append([])
            load = 0
        bins[-1].append(i)
        load += n
    return bins


def first_fit(order: Sequence[int], lengths: Sequence[int], capacity: int) -> Bins:
    """Each sequence, taken in `order`, into the first bin with room (else a new bin)."""
    bins: Bins = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"Sequence length {n} exceeds bin capacity {capacity}")
        slot = next((b for b, r in enumerate(room) if r >= n), None)
        if slot is None:
            bins.append([])
            room.append(capacity)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= n
    return bins


def modified_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> Bins:
    """MFFD: sizes are large (> C/2), medium (> C/3), small (> C/6) or tiny.

    1. one bin per large item, largest first;
    2. forward over those bins, add the largest medium item that fits;
    3. backward over bins without a medium item, add the smallest small item plus the largest
       small item that still fits, when two fit;
    4. forward again, fill each bin greedily with the largest remaining items that fit;
    5. the rest, largest first, into the least loaded extra bin when it fits, else a new one.
    """
    if capacity <= 0:
        raise ValueError("bin_capacity must be positive")
    if any(n <= 0 for n in lengths):
        raise ValueError("sequence lengths must be positive")
    _check_fit(lengths, capacity)

    def is_medium(n: int) -> bool:
        return capacity / 3 < n <= capacity / 2

    ids = range(len(lengths))
    by_size_desc = sorted(ids, key=lambda i: -lengths[i])  # stable: equal sizes keep index order
    by_size_asc = sorted(ids, key=lambda i: lengths[i])
    large = [i for i in by_size_desc if lengths[i] > capacity / 2]
    medium = [i for i in by_size_desc if is_medium(lengths[i])]
    small = [i for i in by_size_asc if capacity / 6 < lengths[i] <= capacity / 3]
    tiny = [i for i in by_size_asc if lengths[i] <= capacity / 6]

    bins: Bins = [[i] for i in large]
    load = [lengths[i] for i in large]

    def add(b: int, item: int) -> None:
        bins[b].append(item)
        load[b] += lengths[item]

    for b in range(len(bins)):
        pick = next((k for k, i in enumerate(medium) if lengths[i] <= capacity - load[b]), None)
        if pick is not None:
            add(b, medium.pop(pick))
    for b in reversed(range(len(bins))):
        if len(small) < 2 or any(is_medium(lengths[i]) for i in bins[b]):
            continue
        room = capacity - load[b]
        if lengths[small[0]] + lengths[small[1]] > room:
            continue
        first = small.pop(0)
        room -= lengths[first]
        second = max(k for k, i in enumerate(small) if lengths[i] <= room)  # small[0] always fits
        add(b, first)
        add(b, small.pop(second))
    rest = sorted(medium + small + tiny, key=lambda i: -lengths[i])
    for b in range(len(bins)):
        while rest and capacity - load[b] >= lengths[rest[-1]]:
            add(b, rest.pop(next(k for k, i in enumerate(rest) if lengths[i] <= capacity - load[b])))

    # Step 5 keeps its bins ordered by load (ties: newest last), so the least loaded is first.
    extra: Bins = [[]]
    extra_load = [0]
    for i in rest:
        if lengths[i] <= capacity - extra_load[0]:
            group, filled = extra.pop(0), extra_load.pop(0)
        else:
            group, filled = [], 0
        group.append(i)
        filled += lengths[i]
        at = bisect.bisect_right(extra_load, filled)
        extra.insert(at, group)
        extra_load.insert(at, filled)
    return [b for b in bins + extra if b]


def split_to_count(bins: Bins, min_bin_count: Optional[int], bin_count_multiple: Optional[int]) -> Bins:
    """Split bins until there are at least `min_bin_count` and a multiple of `bin_count_multiple`:
    each new bin takes the last item of the fullest bin (most items; ties: the later bin) that
    still has two or more."""
    target = max(len(bins), min_bin_count or 0)
    if bin_count_multiple:
        target = -(-target // bin_count_multiple) * bin_count_multiple
    if target == len(bins):
        return bins
    total = sum(len(b) for b in bins)
    if total < target:
        raise ValueError(f"Cannot create {target} bins with only {total} sequences. Each bin must contain at "
                         "least one sequence. Either reduce min_bin_count/bin_count_multiple or provide more sequences.")
    out = [list(b) for b in bins]
    donors = sorted(range(len(bins)), key=lambda b: (len(bins[b]), b), reverse=True)
    d = 0
    for _ in range(target - len(bins)):
        while len(out[donors[d]]) < 2:  # cannot run out: total >= target
            d += 1
        out.append([out[donors[d]].pop()])
    return out


class SequencePacker:
    """A configured packer: `pack(lengths)` -> bins of indices (see the module docstring)."""

    def __init__(self, algorithm: PackingAlgorithm, bin_capacity: int, min_bin_count: Optional[int] = None,
                 bin_count_multiple: Optional[int] = None):
        if min_bin_count is not None and min_bin_count < 0:
            raise ValueError("min_bin_count must be nonnegative")
        if bin_count_multiple is not None and bin_count_multiple < 1:
            raise ValueError("bin_count_multiple must be positive")
        self.algorithm = algorithm
        self.bin_capacity = bin_capacity
        self.min_bin_count = min_bin_count
        self.bin_count_multiple = bin_count_multiple

    def pack(self, sequence_lengths: Sequence[int]) -> Bins:
        lengths = [int(n) for n in sequence_lengths]
        cap = self.bin_capacity
        if self.algorithm is PackingAlgorithm.CONCATENATIVE:
            bins = concatenative(lengths, cap)
        elif self.algorithm is PackingAlgorithm.FIRST_FIT_DECREASING:
            bins = first_fit(sorted(range(len(lengths)), key=lambda i: (lengths[i], i), reverse=True), lengths, cap)
        elif self.algorithm is PackingAlgorithm.FIRST_FIT_SHUFFLE:
            order = list(range(len(lengths)))
            random.shuffle(order)
            bins = first_fit(order, lengths, cap)
        else:
            bins = modified_first_fit_decreasing(lengths, cap)
        return split_to_count(bins, self.min_bin_count, self.bin_count_multiple)


def get_packer(algorithm: Union[PackingAlgorithm, str], bin_capacity: int, collect_metrics: bool = False,
               min_bin_count: Optional[int] = None, bin_count_multiple: Optional[int] = None) -> SequencePacker:
    """The packer for `algorithm` (an enum member or its name, any case). `collect_metrics` is
    accepted for NeMo RL compatibility; this runtime keeps no packing metrics."""
    if isinstance(algorithm, str):
        try:
            algorithm = PackingAlgorithm[algorithm.upper()]
        except KeyError:
            raise ValueError(f"Unknown packing algorithm: {algorithm}. Available algorithms: "
                             f"{', '.join(a.name for a in PackingAlgorithm)}") from None
    if not isinstance(algorithm, PackingAlgorithm):
        raise ValueError(f"Unknown packing algorithm: {algorithm}")
    return SequencePacker(algorithm, bin_capacity, min_bin_count, bin_count_multiple)

"""NamedSharding: an N-dimensional grid of worker ranks with named axes (e.g. pipeline, data,
context and tensor parallel), as NeMo RL's nemo_rl.distributed.named_sharding.NamedSharding.

Pure Python (no numpy needed): the layout is kept as a shape and a row-major list of ranks. It
accepts any nested sequence, or anything with `.tolist()` (numpy arrays, torch tensors). The one
difference from NeMo RL: `layout` returns a torch int64 tensor instead of a numpy array (same
shape and values; numpy functions accept it).
"""
from __future__ import annotations

import itertools
import numbers
from typing import Any, Sequence, Union

# Axes every rank of which holds the same data; a worker at coordinate 0 on all of them leads.
REPLICATED_AXES: tuple[str, ...] = ("tensor_parallel", "context_parallel", "pipeline_parallel")


def _as_rank(value: Any) -> int:
    if hasattr(value, "item") and not isinstance(value, numbers.Number):  # 0-d tensor or array
        value = value.item()
    if isinstance(value, bool):
        raise ValueError("Layout must contain only integer rank IDs.")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(value)
    raise ValueError("Layout must contain only integer rank IDs.")


def _parse_layout(layout: Any) -> tuple[tuple[int, ...], list[int]]:
    """(shape, row-major ranks) of a rectangular nested sequence."""
    if hasattr(layout, "tolist"):
        layout = layout.tolist()

    def shape_of(node: Any) -> tuple[int, ...]:
        if isinstance(node, (list, tuple)):
            shapes = {shape_of(child) for child in node}
            if len(shapes) > 1:
                raise ValueError("Could not create a rank grid from layout: the nested lists are ragged")
            return (len(node), *(shapes.pop() if shapes else ()))
        return ()

    def leaves(node: Any):
        if isinstance(node, (list, tuple)):
            for child in node:
                yield from leaves(child)
        else:
            yield node

    shape = shape_of(layout)
    return shape, [_as_rank(v) for v in leaves(layout)]


def _format_grid(shape: tuple[int, ...], ranks: list[int]) -> str:
    """numpy's str() of an int array: [[0 1]\\n [2 3]], a blank line between 2-D blocks."""
    width = max((len(str(r)) for r in ranks), default=1)

    def render(dims: tuple[int, ...], flat: list[int], indent: int) -> str:
        if not dims:
            return str(flat[0])
        if len(dims) == 1:
            return "[" + " ".join(str(r).rjust(width) for r in flat) + "]"
        step = len(flat) // dims[0] if dims[0] else 0
        sep = "\n" * (len(dims) - 1) + " " * (indent + 1)
        parts = [render(dims[1:], flat[i * step:(i + 1) * step], indent + 1) for i in range(dims[0])]
        return "[" + sep.join(parts) + "]"

    return render(shape, ranks, 0)


class NamedSharding:
    """Ranks laid out on named axes, outermost first.

    >>> s = NamedSharding([[[0, 1, 2, 3], [4, 5, 6, 7]]], ["dp", "pp", "tp"])
    >>> s.shape, s.get_ranks_by_coord(pp=1), s.get_worker_coords(6)
    ({'dp': 1, 'pp': 2, 'tp': 4}, [4, 5, 6, 7], {'dp': 0, 'pp': 1, 'tp': 2})
    """

    def __init__(self, layout: Union[Sequence[Any], Any], names: list[str]):
        shape, ranks = _parse_layout(layout)
        self._setup(shape, ranks, names)

    def _setup(self, shape: tuple[int, ...], ranks: list[int], names: list[str]) -> None:
        self._shape, self._ranks, self._names = shape, ranks, list(names)
        if len(self._shape) != len(self._names):
            raise ValueError(f"Number of dimensions in layout ({len(self._shape)}) "
                             f"must match the number of names ({len(self._names)}).")
        seen: set[int] = set()
        duplicates = sorted({r for r in self._ranks if r in seen or seen.add(r)})
        if duplicates:
            raise ValueError(f"Duplicate ranks found in layout: {duplicates}")
        self._name_to_axis = {name: i for i, name in enumerate(self._names)}
        # row-major strides: coordinates -> position in self._ranks
        self._strides = [1] * len(self._shape)
        for axis in range(len(self._shape) - 2, -1, -1):
            self._strides[axis] = self._strides[axis + 1] * self._shape[axis + 1]

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self._names, self._shape))

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return len(self._ranks)

    @property
    def layout(self):
        """The rank grid as a new torch int64 tensor."""
        import torch
        return torch.tensor(self._ranks, dtype=torch.int64).reshape(self._shape)

    def _axis(self, name: str) -> int:
        if name not in self._name_to_axis:
            raise ValueError(f"Invalid axis name: '{name}'. Valid names are: {self.names}")
        return self._name_to_axis[name]

    def _select(self, fixed: dict[int, int]) -> tuple[tuple[int, ...], list[int]]:
        """(shape, row-major ranks) of the sub-grid with axis -> coordinate fixed."""
        free = [a for a in range(self.ndim) if a not in fixed]
        ranges = [range(self._shape[a]) if a not in fixed else (fixed[a],) for a in range(self.ndim)]
        ranks = [self._ranks[sum(c * s for c, s in zip(coord, self._strides))] for coord in itertools.product(*ranges)]
        return tuple(self._shape[a] for a in free), ranks

    def get_worker_coords(self, worker_id: int) -> dict[str, int]:
        """The coordinates of `worker_id` on every axis; ValueError if it is not in the layout."""
        try:
            pos = self._ranks.index(worker_id)
        except ValueError:
            raise ValueError(f"Worker ID {worker_id} not found in sharding layout.") from None
        return {name: (pos // self._strides[a]) % self._shape[a] for a, name in enumerate(self._names)}

    @staticmethod
    def is_axis_zero(coords: dict[str, int], axes: Sequence[str]) -> bool:
        """True when `coords` is 0 on every axis in `axes` (a missing axis counts as 0)."""
        return all(coords.get(axis, 0) == 0 for axis in axes)

    def get_ranks_by_coord(self, **coords: int) -> list[int]:
        """Sorted ranks at the given coordinates (unnamed axes: any); [] when a coordinate is out
        of range; ValueError for an unknown axis name."""
        fixed = {}
        for name, index in coords.items():
            axis = self._axis(name)
            if not 0 <= index < self._shape[axis]:
                return []
            fixed[axis] = index
        return sorted(set(self._select(fixed)[1]))

    def get_ranks(self, **kwargs: int) -> Union["NamedSharding", int]:
        """The sub-grid at the given coordinates, as a NamedSharding over the remaining axes, or
        the single rank when every axis is given. IndexError for an out-of-range coordinate."""
        fixed = {}
        for name, index in kwargs.items():
            axis = self._axis(name)
            if not 0 <= index < self._shape[axis]:
                raise IndexError(f"Index {index} is out of bounds for axis '{name}' with size {self._shape[axis]}")
            fixed[axis] = index
        shape, ranks = self._select(fixed)
        if not shape:
            return ranks[0]
        sub = NamedSharding.__new__(NamedSharding)
        sub._setup(shape, ranks, [n for a, n in enumerate(self._names) if a not in fixed])
        return sub

    def get_axis_index(self, name: str) -> int:
        return self._axis(name)

    def get_axis_size(self, name: str) -> int:
        return self.shape[name]

    def __repr__(self) -> str:
        dims = ", ".join(str(n) for n in self._shape)
        return f"NamedSharding(shape=({dims}), names={self._names}, layout={_format_grid(self._shape, self._ranks)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self._names == other._names and self._shape == other._shape and self._ranks == other._ranks

    __hash__ = None  # mutable-looking value type, as in NeMo RL (which defines __eq__ only)


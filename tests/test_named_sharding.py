"""NamedSharding: a grid of ranks on named axes (NeMo RL's named_sharding semantics, no numpy)."""
import pickle

import pytest
torch = pytest.importorskip("torch")  # the engine-free tier runs without torch too: skipped there

from runtime.workers.named_sharding import REPLICATED_AXES, NamedSharding

# pp=2, dp=3, tp=2: rank = pp * 6 + dp * 2 + tp
GRID = [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9], [10, 11]]]
AXES = ["pp", "dp", "tp"]


@pytest.fixture
def grid():
    return NamedSharding(GRID, AXES)


def test_shape_names_size_and_layout(grid):
    assert grid.shape == {"pp": 2, "dp": 3, "tp": 2} and grid.names == AXES
    assert grid.ndim == 3 and grid.size == 12
    assert torch.equal(grid.layout, torch.arange(12).reshape(2, 3, 2))
    grid.names.append("x")  # copies: the sharding is not changed through them
    grid.layout[0, 0, 0] = 99
    assert grid.names == AXES and grid.layout[0, 0, 0] == 0
    assert grid.get_axis_index("tp") == 2 and grid.get_axis_size("dp") == 3


def test_layout_may_be_a_tensor_or_integral_floats():
    assert NamedSharding(torch.arange(4).reshape(2, 2), ["dp", "tp"]) == NamedSharding([[0, 1], [2, 3]], ["dp", "tp"])
    assert NamedSharding([[0.0, 1.0]], ["a", "b"]).get_ranks(a=0, b=1) == 1


@pytest.mark.parametrize("layout, names, message", [
    ([[0, 1], [2, 3]], ["dp"], "Number of dimensions in layout \\(2\\) must match the number of names \\(1\\)"),
    ([[0, 1], [2, 2.5]], ["a", "b"], "only integer rank IDs"),
    ([[3, 1], [1, 3]], ["a", "b"], "Duplicate ranks found in layout: \\[1, 3\\]"),
    ([[0, 1], [2]], ["a", "b"], "ragged"),
])
def test_invalid_layouts(layout, names, message):
    with pytest.raises(ValueError, match=message):
        NamedSharding(layout, names)


def test_worker_coords_and_leader_check(grid):
    assert grid.get_worker_coords(9) == {"pp": 1, "dp": 1, "tp": 1}
    assert grid.get_worker_coords(4) == {"pp": 0, "dp": 2, "tp": 0}
    with pytest.raises(ValueError, match="Worker ID 12 not found"):
        grid.get_worker_coords(12)
    assert NamedSharding.is_axis_zero({"pp": 0, "dp": 2, "tp": 0}, ["pp", "tp"])
    assert not NamedSharding.is_axis_zero({"tensor_parallel": 1}, REPLICATED_AXES)
    assert NamedSharding.is_axis_zero({}, REPLICATED_AXES)


def test_ranks_by_coord(grid):
    assert grid.get_ranks_by_coord(dp=1) == [2, 3, 8, 9]
    assert grid.get_ranks_by_coord(pp=1, tp=0) == [6, 8, 10]
    assert grid.get_ranks_by_coord() == list(range(12))
    assert grid.get_ranks_by_coord(dp=3) == [] and grid.get_ranks_by_coord(tp=-1) == []
    with pytest.raises(ValueError, match="Invalid axis name: 'ep'"):
        grid.get_ranks_by_coord(ep=0)


def test_get_ranks_returns_a_sub_grid_or_a_rank(grid):
    assert grid.get_ranks(dp=2) == NamedSharding([[4, 5], [10, 11]], ["pp", "tp"])
    assert grid.get_ranks(pp=1, tp=1) == NamedSharding([7, 9, 11], ["dp"])
    assert grid.get_ranks(pp=1, dp=0, tp=1) == 7
    assert grid.get_ranks() == grid
    with pytest.raises(IndexError, match="Index 3 is out of bounds for axis 'dp' with size 3"):
        grid.get_ranks(dp=3)
    with pytest.raises(ValueError, match="Invalid axis name"):
        grid.get_ranks(cp=0)


def test_equality_repr_and_pickle(grid):
    assert grid != NamedSharding(GRID, ["a", "b", "c"]) and grid != "grid"
    assert NamedSharding([[0, 1, 2, 3]], ["a", "b"]) != NamedSharding([[0, 1], [2, 3]], ["a", "b"])
    assert repr(NamedSharding([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ["a", "b", "c"])) == (
        "NamedSharding(shape=(2, 2, 2), names=['a', 'b', 'c'], layout=[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]])")
    assert "layout=[ 0  9 10]" in repr(NamedSharding([0, 9, 10], ["dp"]))
    assert pickle.loads(pickle.dumps(grid)) == grid

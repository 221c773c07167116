"""The worker group's data path on a two-raylet ray.cluster_utils.Cluster: data put in the object
store once and handed over by reference, CPU tensors mapped zero-copy from shared memory, and
workers that load their own shard."""
import pytest
import ray
import torch

from runtime.workers import transfer
from runtime.workers.batched import BatchedDataDict
from runtime.workers.transfer import ShardLoader
from runtime.workers.virtual_cluster import RayVirtualCluster
from runtime.workers.worker_group import RayWorkerGroup

pytestmark = pytest.mark.cluster  # starts real Ray nodes

PLASMA = "plasma"  # Ray's object store: a /dev/shm (or fallback) file named plasma*


@pytest.fixture(scope="module")
def group(two_nodes):
    from helpers.workers import DataProbe
    vc = RayVirtualCluster([2, 2])
    g = RayWorkerGroup(vc, DataProbe, backend=None)
    yield g
    g.shutdown()
    vc.shutdown()


@pytest.fixture
def puts(monkeypatch):
    """Counts the driver's ray.put calls (the real ray.put runs)."""
    calls = []
    real = ray.put

    def counting(value, *a, **kw):
        calls.append(type(value).__name__)
        return real(value, *a, **kw)
    monkeypatch.setattr(ray, "put", counting)
    return calls


def test_single_data_is_put_once_and_every_worker_maps_it(group, puts):
    t = torch.arange(64 * 1024, dtype=torch.float32)
    out = group.run_all_workers_single_data("tensor", t)
    assert puts == ["Tensor"], "one put for all four workers"
    assert {o["sum"] for o in out} == {float(t.sum())}
    # zero-copy: each worker's tensor lies in its node's object store, not in a copy on its heap
    assert all(PLASMA in o["mapping"] for o in out), [o["mapping"] for o in out]


def test_sharded_batch_is_one_put_per_shard_handed_by_reference(group, puts):
    data = BatchedDataDict({"x": torch.arange(8).float(), "id": list(range(8))})
    out = group.run_all_workers_sharded_batch("batch", data)
    assert puts == ["SlicedDataDict"] * 4  # each shard of a BatchedDataDict is a SlicedDataDict (NeMo RL)
    assert [o["ids"] for o in out] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [o["x"] for o in out] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    assert all(PLASMA in o["mapping"] for o in out)


def test_object_refs_from_the_caller_are_passed_through(group, puts):
    refs = [ray.put(torch.full((4,), float(i))) for i in range(4)]
    puts.clear()
    out = group.run_all_workers_multiple_data("tensor", refs)
    assert puts == [] and [o["sum"] for o in out] == [0.0, 4.0, 8.0, 12.0]


def test_small_plain_arguments_stay_inline(group, puts):
    out = group.run_all_workers_single_data("tensor", torch.ones(2), scale=3.0)
    assert puts == ["Tensor"] and {o["sum"] for o in out} == {6.0}  # the float kwarg was not put


def test_tensors_that_cannot_be_zero_copy_arrive_intact(group):
    cases = [torch.arange(12.0).reshape(3, 4).t(),                 # not contiguous
             torch.ones(5, requires_grad=True),                    # needs grad
             torch.arange(6, dtype=torch.bfloat16),                # no numpy dtype (sent as bytes)
             torch.tensor(7, dtype=torch.int64)]                   # 0-d
    for t in cases:
        out = group.run_all_workers_single_data("tensor", t)
        assert {(o["dtype"], tuple(o["shape"]), o["sum"], o["requires_grad"]) for o in out} == \
               {(str(t.dtype), tuple(t.shape), float(t.detach().float().sum()), t.requires_grad)}


def test_zero_copy_scope_is_left_clean_and_keeps_a_users_reducer():
    from ray.cloudpickle import CloudPickler
    assert torch.Tensor not in CloudPickler.dispatch
    with transfer.zero_copy_tensors():
        assert CloudPickler.dispatch[torch.Tensor] is transfer._reduce_tensor
    assert torch.Tensor not in CloudPickler.dispatch
    mine = lambda t: (torch.zeros, (1,))  # noqa: E731
    CloudPickler.dispatch[torch.Tensor] = mine
    try:
        with transfer.zero_copy_tensors():
            assert CloudPickler.dispatch[torch.Tensor] is mine
    finally:
        CloudPickler.dispatch.pop(torch.Tensor)


def test_workers_load_their_own_shard_and_nothing_is_put(group, puts):
    from helpers.workers import own_shard
    out = group.run_all_workers_own_shard("batch", ShardLoader(own_shard, 8, offset=100))
    assert puts == []
    assert [o["ids"] for o in out] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [o["x"] for o in out] == [[100.0, 104.0], [101.0, 105.0], [102.0, 106.0], [103.0, 107.0]]
    with pytest.raises(TypeError, match="ShardLoader"):
        group.run_all_workers_own_shard("batch", own_shard)
    with pytest.raises(TypeError, match="callable"):
        ShardLoader("not a function")

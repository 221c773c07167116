"""BatchedDataDict sharding math."""
import pytest
import torch

from runtime.batched import BatchedDataDict


def bdd(n=12):
    return BatchedDataDict({"x": torch.arange(n).float().unsqueeze(1), "id": list(range(n))})


def test_shard_whole_batch_contiguous():
    shards = bdd().shard_by_batch_size(3)
    assert [s["id"] for s in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_shard_per_global_batch():
    shards = bdd().shard_by_batch_size(2, batch_size=6)
    assert shards[0]["id"] == [0, 1, 2, 6, 7, 8] and shards[1]["id"] == [3, 4, 5, 9, 10, 11]
    assert torch.equal(shards[1]["x"].squeeze(1), torch.tensor([3., 4, 5, 9, 10, 11]))
    assert sorted(i for s in shards for i in s["id"]) == list(range(12))


def test_shard_errors():
    with pytest.raises(ValueError, match="cannot shard 12 samples in batches of 5"):
        bdd().shard_by_batch_size(2, batch_size=5)
    with pytest.raises(ValueError, match="different batch sizes"):
        BatchedDataDict({"a": torch.zeros(3), "b": [1, 2]})


def test_chunk_slice_repeat_microbatches_to():
    d = bdd(6)
    assert d.chunk(1, 3)["id"] == [2, 3]
    assert d[1:3]["id"] == [1, 2]
    r = d.slice(0, 2).repeat_interleave(3)
    assert r["id"] == [0, 0, 0, 1, 1, 1] and r["x"].squeeze(1).tolist() == [0, 0, 0, 1, 1, 1]
    mbs = list(d.make_microbatch_iterator(4))
    assert [m.size for m in mbs] == [4, 2]
    assert BatchedDataDict.from_batches(mbs)["id"] == d["id"]
    assert d.to("cpu")["x"].device.type == "cpu"

"""BatchedDataDict: NeMo RL's batched_data_dict semantics (sharding, micro-batch plans, stacking,
repeating, multimodal PackedTensors) on our dict subclass.

Behaviour that changed when we adopted NeMo RL's semantics (so that NeMo RL code behaves the same
after changing its imports), and why the tests below expect it:
- the constructor no longer checks that values have equal row counts (NeMo RL's does not; sharding
  and chunking check instead) and `size` reads the first value;
- shape errors are BatchShapeError, which is an AssertionError (what NeMo RL raises) as well as
  the ValueError we raised before, with NeMo RL's messages;
- make_microbatch_iterator needs the micro-batch size to divide the batch (no short last one);
- `to` moves values in place and returns the same object;
- shards and slices are SlicedDataDict (a BatchedDataDict subclass);
- repeat_interleave deep-copies list rows, so repeats are independent objects.
"""
import copy
import pickle

import pytest
torch = pytest.importorskip("torch")  # the engine-free tier runs without torch too: skipped there

from runtime.workers.batched import (BatchedDataDict, BatchShapeError, DynamicBatchingArgs, PackedTensor, SequencePackingArgs,
                             SlicedDataDict)
from runtime.workers.batching.packing import get_packer


def bdd(n=12):
    return BatchedDataDict({"x": torch.arange(n).float().unsqueeze(1), "id": list(range(n))})


def packing_args(max_tokens, **extra) -> SequencePackingArgs:
    fields = dict(max_tokens_per_microbatch=max_tokens, input_key="tokens", input_lengths_key="lens",
                  algorithm="modified_first_fit_decreasing", sequence_length_pad_multiple=1)
    return SequencePackingArgs(**{**fields, **extra})


def token_batch(lens, width=None):
    width = width or max(lens)
    return BatchedDataDict({"tokens": torch.zeros(len(lens), width, dtype=torch.long),
                            "lens": torch.tensor(lens), "uid": torch.arange(len(lens))})


# -- construction, size, dict behaviour -------------------------------------------------------------
def test_constructor_accepts_unequal_values_and_size_reads_the_first():
    d = BatchedDataDict({"a": [1, 2, 3], "b": torch.zeros(5)})
    assert d.size == 3
    assert BatchedDataDict().size == 0
    media = PackedTensor([torch.ones(2, 1), torch.ones(1, 1), torch.ones(3, 1)], dim_to_pack=0)
    assert BatchedDataDict({"pixel_values": media, "ids": [7, 8, 9]}).size == 3


def test_is_a_picklable_dict_that_keeps_its_plans():
    d = bdd(4)
    d.micro_batch_indices, d.micro_batch_lengths = [[[0, 4]]], [[9]]
    back = pickle.loads(pickle.dumps(d))
    assert isinstance(back, dict) and type(back) is BatchedDataDict and back["id"] == [0, 1, 2, 3]
    assert back.micro_batch_indices == [[[0, 4]]] and back.micro_batch_lengths == [[9]]
    dup = d.copy()
    assert type(dup) is BatchedDataDict and dup.micro_batch_lengths == [[9]] and dup is not d
    assert d.get_dict() is d and d.data is d


def test_shards_count_as_batches_for_the_object_store():
    from runtime.workers.transfer import worth_putting
    shard = bdd(4).shard_by_batch_size(2)[0]
    assert isinstance(shard, SlicedDataDict) and isinstance(shard, BatchedDataDict) and worth_putting(shard)


# -- plain sharding -------------------------------------------------------------------------------
def test_shard_whole_batch_contiguous():
    shards = bdd().shard_by_batch_size(3)
    assert [s["id"] for s in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(type(s) is SlicedDataDict for s in shards)


def test_shard_per_global_batch():
    shards = bdd().shard_by_batch_size(2, batch_size=6)
    assert shards[0]["id"] == [0, 1, 2, 6, 7, 8] and shards[1]["id"] == [3, 4, 5, 9, 10, 11]
    assert torch.equal(shards[1]["x"].squeeze(1), torch.tensor([3., 4, 5, 9, 10, 11]))
    assert sorted(i for s in shards for i in s["id"]) == list(range(12))


def test_uneven_shards_end_short_or_empty_but_keep_every_key():
    d = BatchedDataDict({"t": torch.arange(5), "media": PackedTensor([torch.ones(1, 2)] * 5, dim_to_pack=0),
                         "tag": list("abcde")})
    shards = d.shard_by_batch_size(4, allow_uneven_shards=True)
    assert [s["tag"] for s in shards] == [["a", "b"], ["c", "d"], ["e"], []]
    empty = shards[3]
    assert empty.size == 0 and empty["t"].shape == (0,) and len(empty["media"]) == 0
    assert empty["media"].as_tensor() is None
    with pytest.raises(AssertionError, match="batch_size must be None"):
        d.shard_by_batch_size(2, batch_size=4, allow_uneven_shards=True)


def test_shard_errors_are_assertion_and_value_errors():
    with pytest.raises(BatchShapeError, match=r"Total batch size \(12\) is not a multiple of batch_size \(5\)"):
        bdd().shard_by_batch_size(2, batch_size=5)
    with pytest.raises(ValueError, match=r"Batch size \(6\) is not a multiple of shards \(4\)"):
        bdd().shard_by_batch_size(4, batch_size=6)
    with pytest.raises(AssertionError, match="Batch sizes are not the same across the rollout batch"):
        BatchedDataDict({"a": torch.zeros(3), "b": [1, 2]}).shard_by_batch_size(1)
    assert issubclass(BatchShapeError, AssertionError) and issubclass(BatchShapeError, ValueError)


# -- dynamic batching -------------------------------------------------------------------------------
def test_dynamic_batching_sorts_deals_and_plans_microbatches():
    lens = [9, 3, 12, 1, 7, 5]
    d = BatchedDataDict({"tokens": torch.ones(6, 16), "lens": torch.tensor(lens), "uid": list(range(6))})
    args: DynamicBatchingArgs = {"input_key": "tokens", "input_lengths_key": "lens", "sequence_length_round": 4,
                                 "max_tokens_per_microbatch": 16}
    shards, order = d.shard_by_batch_size(2, dynamic_batching_args=args)
    # ascending length: uid 3(1) 1(3) 5(5) 4(7) 0(9) 2(12); dealt alternately to the two shards
    assert order == [3, 5, 0, 1, 4, 2]
    assert [s["uid"] for s in shards] == [[3, 5, 0], [1, 4, 2]]
    # per position, the longer of the two shards' rows rounded up to 4: 4, 8, 12; 2 x 8 fits 16, 12 alone
    for s in shards:
        assert s.micro_batch_indices == [[[0, 2], [2, 3]]] and s.micro_batch_lengths == [[8, 12]]
    mbs = list(shards[1].make_microbatch_iterator_with_dynamic_shapes())
    assert [tuple(mb["tokens"].shape) for mb in mbs] == [(2, 8), (1, 12)] and mbs[0]["uid"] == [1, 4]
    assert shards[1].get_microbatch_iterator_dynamic_shapes_len() == 2
    restored = BatchedDataDict.from_batches(shards)
    restored.reorder_data(order)
    assert restored["uid"] == list(range(6))


def test_dynamic_batching_rejects_a_row_over_budget():
    d = BatchedDataDict({"tokens": torch.ones(2, 40), "lens": torch.tensor([30, 2])})
    args = {"input_key": "tokens", "input_lengths_key": "lens", "sequence_length_round": 8,
            "max_tokens_per_microbatch": 16}
    with pytest.raises(AssertionError, match="sequence length of 32"):
        d.shard_by_batch_size(1, dynamic_batching_args=args)


# -- sequence packing ----------------------------------------------------------------------------
def test_mffd_bins_match_the_published_heuristic():
    # capacity 60: large 40, 35; medium 25, 21; small 12, 11; tiny 4
    bins = get_packer("modified_first_fit_decreasing", 60).pack([40, 12, 25, 35, 4, 11, 21])
    # 1-2: bins [40], [35]; 40 has room 20, no medium fits; 35 takes 25. 3: the two smallest smalls
    # (11 + 12) do not fit beside 40. 4: 40 takes 12 then 4. 5: 21 and 11 share one extra bin.
    assert sorted(map(sorted, bins)) == sorted(map(sorted, [[0, 1, 4], [3, 2], [6, 5]]))
    assert get_packer("first_fit_decreasing", 10).pack([6, 5, 4, 3]) == [[0, 2], [1, 3]]
    assert get_packer("CONCATENATIVE", 10).pack([6, 5, 4, 3]) == [[0], [1, 2], [3]]
    assert len(get_packer("concatenative", 100, min_bin_count=3).pack([1, 1, 1, 1])) == 3
    assert len(get_packer("concatenative", 100, bin_count_multiple=4).pack([50, 50, 50, 50, 1])) == 4
    with pytest.raises(ValueError, match="exceeds bin capacity"):
        get_packer("first_fit_decreasing", 10).pack([11])
    with pytest.raises(ValueError, match="Unknown packing algorithm"):
        get_packer("best_fit", 10)


def test_sequence_packing_shards_bins_round_robin_and_restores_order():
    lens = [70, 20, 45, 90, 10, 15, 60, 30]
    d = token_batch(lens)
    shards, order = d.shard_by_batch_size(2, sequence_packing_args=packing_args(100))
    # MFFD: [90, 10], [70, 30], [60, 20, 15], [45]: bins 0, 2 -> shard 0; bins 1, 3 -> shard 1
    assert [s.micro_batch_lengths for s in shards] == [[[100, 95]], [[100, 45]]]
    assert [s["uid"].tolist() for s in shards] == [[3, 4, 6, 1, 5], [0, 7, 2]]
    assert shards[0].micro_batch_indices == [[[0, 2], [2, 5]]] and shards[0].elem_counts_per_gb == [5]
    assert order == [3, 4, 6, 1, 5, 0, 7, 2]
    assert shards[1].get_microbatch_iterator_for_packable_sequences_len() == (2, 100)
    assert [mb["uid"].tolist() for mb in shards[1].make_microbatch_iterator_for_packable_sequences()] == [[0, 7], [2]]
    restored = BatchedDataDict.from_batches(shards)
    restored.reorder_data(order)
    assert torch.equal(restored["uid"], d["uid"]) and torch.equal(restored["lens"], d["lens"])


def test_sequence_packing_per_global_batch_largest_first_and_padding():
    lens = [5, 30, 12, 40, 33, 7, 20, 18]
    d = token_batch(lens)
    shards, _ = d.shard_by_batch_size(2, batch_size=4, sequence_packing_args=packing_args(
        48, microbatch_order="largest_first", sequence_length_pad_multiple=8))
    for s in shards:
        assert len(s.micro_batch_lengths) == 2 and len(s.elem_counts_per_gb) == 2
        for gb, lengths in enumerate(s.micro_batch_lengths):
            assert lengths == sorted(lengths, reverse=True) and all(n % 8 == 0 and n <= 48 for n in lengths)
            part = s.get_batch(gb)
            assert part.elem_counts_per_gb == [s.elem_counts_per_gb[gb]]
            assert all(gb * 4 <= u < gb * 4 + 4 for u in part["uid"].tolist())
            assert sum(mb.size for mb in part.make_microbatch_iterator_for_packable_sequences()) == part.size


def test_sequence_packing_argument_errors():
    d = token_batch([3, 4])
    with pytest.raises(ValueError, match="microbatch_order"):
        d.shard_by_batch_size(1, sequence_packing_args=packing_args(8, microbatch_order="smallest_first"))
    with pytest.raises(AssertionError, match="cannot be passed together"):
        d.shard_by_batch_size(1, sequence_packing_args=packing_args(8), dynamic_batching_args={
            "input_key": "tokens", "input_lengths_key": "lens", "sequence_length_round": 1,
            "max_tokens_per_microbatch": 8})


# -- stacking -------------------------------------------------------------------------------------
def test_from_batches_pads_each_kind_of_value():
    a = BatchedDataDict({"ids": torch.tensor([[1, 2], [3, 4]]), "n": torch.tensor([2, 2]), "txt": ["p", "q"],
                         "logits": torch.ones(2, 2, 3)})
    b = BatchedDataDict({"ids": torch.tensor([[5, 6, 7]]), "n": torch.tensor([3]), "txt": ["r"],
                         "logits": torch.ones(1, 4, 3)})
    out = BatchedDataDict.from_batches([a, b], pad_value_dict={"ids": -1, "logits": -2.0})
    assert list(out) == ["ids", "logits", "n", "txt"]  # sorted, as NeMo RL's
    assert out["ids"].tolist() == [[1, 2, -1], [3, 4, -1], [5, 6, 7]]
    assert out["n"].tolist() == [2, 2, 3] and out["txt"] == ["p", "q", "r"]
    assert out["logits"].shape == (3, 4, 3) and out["logits"][0, 2:].eq(-2).all() and out["logits"][2].eq(1).all()
    assert type(SlicedDataDict.from_batches([a])) is SlicedDataDict and BatchedDataDict.from_batches([]) == {}


def test_from_batches_missing_keys_and_values_without_a_length():
    class Opaque:
        def __len__(self):
            raise AssertionError("not a batch value")

    rows = {"ids": torch.tensor([[1]]), "meta": Opaque()}
    with pytest.raises(KeyError, match="'extra'"):
        BatchedDataDict.from_batches([rows, {**rows, "extra": torch.tensor([0])}])
    empty = {"ids": torch.zeros(0, 0, dtype=torch.long)}
    out = BatchedDataDict.from_batches([empty, {"ids": torch.tensor([[4, 5]]), "extra": torch.tensor([9])}])
    assert out["ids"].tolist() == [[4, 5]] and out["extra"].tolist() == [9]


def test_from_batches_can_fill_missing_media_with_empty_rows():
    image = PackedTensor(torch.ones(1, 2), dim_to_pack=0).enable_deduplication()
    with_media = {"ids": torch.tensor([[1], [2]]), "pixel_values": PackedTensor.concat([image, image])}
    text_only = {"ids": torch.tensor([[3]])}
    with pytest.raises(KeyError, match="non-empty batches"):
        BatchedDataDict.from_batches([with_media, text_only])
    out = BatchedDataDict.from_batches([with_media, text_only], allow_missing_packed_tensors=True)
    assert len(out["pixel_values"]) == 3 and len(out["pixel_values"].tensors) == 1
    assert out["pixel_values"].logical_segment_counts_by_row() == [1, 1, 0]
    with pytest.raises(ValueError, match="inconsistent logical row counts"):
        BatchedDataDict.from_batches([{"ids": torch.tensor([[1], [2]]), "pixel_values": image}],
                                     allow_missing_packed_tensors=True)


# -- selecting, repeating, trimming ---------------------------------------------------------------
def test_slice_select_chunk_and_getitem():
    d = bdd(6)
    s = d.slice(1, 3)
    assert type(s) is SlicedDataDict and s["id"] == [1, 2] and s["x"].data_ptr() == d["x"][1].data_ptr()
    with pytest.raises(AssertionError, match="end: 9 is greater"):
        d.slice(4, 9)
    assert d[1:3]["id"] == [1, 2]
    assert d.select_indices([5, 0])["id"] == [5, 0]
    assert d.select_indices(torch.tensor([2, 2]))["x"].squeeze(1).tolist() == [2.0, 2.0]
    assert d.chunk(1, 3)["id"] == [2, 3] and d.chunk(2, 3)["id"] == [4, 5]
    assert bdd(4).chunk(3, 4)["id"] == [3]  # NeMo RL's bound check rejects this valid rank; ours does not
    with pytest.raises(ValueError, match="not a multiple of chunks"):
        d.chunk(0, 4)


def test_repeat_interleave_copies_rows_and_can_share_media():
    d = BatchedDataDict({"t": torch.tensor([1, 2]), "msgs": [{"text": "a"}, {"text": "b"}]})
    r = d.repeat_interleave(2)
    assert r["t"].tolist() == [1, 1, 2, 2] and [m["text"] for m in r["msgs"]] == ["a", "a", "b", "b"]
    r["msgs"][0]["text"] = "changed"
    assert r["msgs"][1]["text"] == "a" and d["msgs"][0]["text"] == "a"

    img = torch.ones(3, 3)
    media = BatchedDataDict({"vllm_images": [[img]],
                             "chat": [[{"type": "image", "image": img}, {"type": "text", "text": [1]}]]})
    plain, shared = media.repeat_interleave(2), media.repeat_interleave(2, share_immutable_media=True)
    assert plain["vllm_images"][0][0] is not plain["vllm_images"][1][0]
    assert shared["vllm_images"][0][0] is shared["vllm_images"][1][0] is img
    assert shared["vllm_images"][0] is not shared["vllm_images"][1]
    assert shared["chat"][1][0]["image"] is img and shared["chat"][1][1]["text"] is not media["chat"][0][1]["text"]
    with pytest.raises(NotImplementedError, match="PackedTensor"):
        BatchedDataDict({"pixel_values": PackedTensor(img, dim_to_pack=0)}).repeat_interleave(2)


def test_truncate_reorder_get_batch_microbatches_and_to():
    d = BatchedDataDict({"tok": torch.arange(12).reshape(4, 3), "n": torch.arange(4), "tag": list("wxyz")})
    d.truncate_tensors(dim=1, truncated_len=2)
    assert d["tok"].shape == (4, 2) and d["n"].shape == (4,)
    d.reorder_data([2, 0, 3, 1])  # the row now at p came from position [2, 0, 3, 1][p]
    assert d["tag"] == ["x", "z", "w", "y"]
    assert d.get_batch(1, batch_size=2)["tag"] == ["w", "y"]
    assert [mb["tag"] for mb in d.make_microbatch_iterator(2)] == [["x", "z"], ["w", "y"]]
    with pytest.raises(AssertionError, match="not a multiple of the provided microbatch size"):
        list(d.make_microbatch_iterator(3))
    assert d.to("cpu") is d and d.to_device("cpu") is d and d["tok"].device.type == "cpu"


# -- PackedTensor and multimodal ------------------------------------------------------------------
def test_packed_tensor_plain_and_deduplicated_forms():
    plain = PackedTensor([torch.ones(2, 4), None, torch.zeros(1, 4)], dim_to_pack=0)
    assert len(plain) == 3 and plain.as_tensor().shape == (3, 4) and not plain.deduplication_enabled
    assert plain.logical_segment_counts_by_row() == [1, 0, 1] and plain.slice([2]).as_tensor().sum() == 0

    a = PackedTensor(torch.full((1, 2), 1.0), dim_to_pack=0).enable_deduplication()
    b = PackedTensor(torch.full((1, 2), 2.0), dim_to_pack=0).enable_deduplication()
    rows = PackedTensor.concat([a, a, b, a])
    assert len(rows) == 4 and len(rows.tensors) == 2 and rows._segment_indices == [0, 0, 1, 0]
    picked = rows.slice([3, 2])
    assert len(picked.tensors) == 2 and picked.as_tensor()[:, 0].tolist() == [1.0, 2.0]
    assert len(rows.slice([0, 1]).tensors) == 1
    both = PackedTensor.merge_segments([a, b])
    assert len(both) == 1 and both.logical_segment_counts_by_row() == [2]
    twin = copy.deepcopy(rows)
    assert twin is not rows and twin.tensors[0] is rows.tensors[0]
    again = pickle.loads(pickle.dumps(rows))
    assert len(PackedTensor.concat([rows, again]).tensors) == 2  # provenance survives pickling
    half = rows.to_dtype(torch.float16)
    assert half.tensors[0].dtype == torch.float16 and half._segment_provenance != rows._segment_provenance
    assert PackedTensor.empty_rows_like(rows, 2).logical_segment_counts_by_row() == [0, 0]


def test_packed_tensor_pads_to_the_largest_shape_when_asked():
    p = PackedTensor([torch.ones(1, 2), torch.ones(2, 3)], dim_to_pack=0, pad_to_max_shape=True)
    out = p.as_tensor()
    assert out.shape == (3, 3) and out[0].tolist() == [1, 1, 0]


def test_multimodal_dict_and_sharding_with_media():
    media = PackedTensor([torch.ones(2, 3, 4, 4), torch.ones(1, 3, 4, 4), torch.ones(3, 3, 4, 4)], dim_to_pack=0)
    d = BatchedDataDict({"input_ids": torch.arange(6).reshape(3, 2), "pixel_values": media,
                         "token_type_ids": torch.zeros(3, 2), "answer": [0, 1, 2]})
    mm = d.get_multimodal_dict()
    assert set(mm) == {"pixel_values", "token_type_ids"} and mm["pixel_values"] is media
    as_t = d.get_multimodal_dict(as_tensors=True, pixel_dtype=torch.bfloat16)
    assert as_t["pixel_values"].shape == (6, 3, 4, 4) and as_t["pixel_values"].dtype == torch.bfloat16
    first, second = d.shard_by_batch_size(3, allow_uneven_shards=True)[:2]
    assert first["pixel_values"].as_tensor().shape[0] == 2 and second["pixel_values"].as_tensor().shape[0] == 1

    pixels = PackedTensor.concat([PackedTensor(torch.ones(1, 2), 0).enable_deduplication()] * 2)
    sizes = PackedTensor.concat([PackedTensor(torch.tensor([[1, 1]]), 0).enable_deduplication(),
                                 PackedTensor.empty_rows_like(pixels, 1)])
    with pytest.raises(ValueError, match="ordered per-row segment counts"):
        BatchedDataDict({"pixel_values": pixels, "imgs_sizes": sizes}).get_multimodal_dict(as_tensors=True)


# -- all_gather (two CPU processes over gloo) ------------------------------------------------------
def _gather_worker(rank, path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    part = BatchedDataDict({"x": torch.full((rank + 1, 2), float(rank)), "tag": [f"r{rank}"] * (rank + 1)})
    out = part.all_gather(dist.group.WORLD)
    assert out["x"][:, 0].tolist() == [0.0, 1.0, 1.0] and out["tag"] == ["r0", "r1", "r1"]
    dist.destroy_process_group()


def test_all_gather_joins_jagged_rows_across_ranks(tmp_path):
    import torch.multiprocessing as mp
    mp.start_processes(_gather_worker, args=(str(tmp_path / "rendezvous"),), nprocs=2, start_method="fork")


@pytest.mark.parametrize("call", [
    lambda b: b.slice(0, 2), lambda b: b.select_indices([0, 1]), lambda b: b.repeat_interleave(2),
    lambda b: list(b.make_microbatch_iterator(1)), lambda b: b.chunk(0, 1), lambda b: b.get_batch(0, 2),
    lambda b: b.shard_by_batch_size(1)])
def test_every_row_helper_refuses_values_of_different_lengths(call):
    """Rows would not line up: the helper names the sizes instead of returning misaligned rows."""
    batch = BatchedDataDict({"ids": torch.arange(4), "labels": [0, 1, 2], "mask": torch.ones(4, 2)})
    with pytest.raises(BatchShapeError, match=r"found sizes: \[3,4\]"):
        call(batch)


@pytest.mark.parametrize("call,says", [
    (lambda d: d.slice(2, 1), r"slice end: 1 is not a whole number >= 2"),
    (lambda d: d.slice(0, 5), r"end: 5 is greater than the shape of the batch: 4 rows"),
    (lambda d: d.slice(-1, 2), r"slice start: -1 is not a whole number >= 0"),
    (lambda d: d.slice(0, 2.0), r"slice end: '2\.0' is not a whole number; give an int"),
    (lambda d: d.repeat_interleave(-1), r"num_repeats: -1 is not a whole number >= 0"),
    (lambda d: d.repeat_interleave(True), r"num_repeats: 'True' is not a whole number; give an int"),
    (lambda d: d.select_indices([5]), r"select_indices\[0\]: 5 is not a whole number between 0 and 3"),
    (lambda d: d.select_indices([0, -1]), r"select_indices\[1\]: -1 is not a whole number between 0 and 3"),
    (lambda d: d.chunk(0, 2.0), r"chunks: '2\.0' is not a whole number; give an int"),
    (lambda d: d.chunk(0, 0), r"chunks: 0 is not a whole number >= 1"),
    (lambda d: d.get_batch(3, 2), r"get_batch: batch 3 of 2 rows ends at row 8, past the 4 rows"),
    (lambda d: d.get_batch(0, 0), r"batch_size: 0 is not a whole number >= 1"),
    (lambda d: d.reorder_data([0, 0, 1, 2]), r"reorder_data: the indices are not each row number 0-3 once"),
    (lambda d: d.reorder_data([0, 1, 2]), r"reorder_data: the indices are not each row number 0-3 once"),
    (lambda d: BatchedDataDict.from_batches([{"x": torch.arange(2)}, {"x": [1, 2]}]),
     r"from_batches: the batches' values for key 'x' are of different kinds \(list, tensor\)"),
])
def test_a_bad_index_count_or_size_is_one_clear_error(call, says):
    """Round 4's cases: each was silently wrong (an empty slice, a lost row) or a bare torch/Python error; each
    is a BatchShapeError (an AssertionError, as NeMo RL's asserts, and a ValueError) naming the value."""
    d = BatchedDataDict({"x": torch.arange(4), "y": [10, 11, 12, 13]})
    before = {k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in d.items()}
    with pytest.raises(BatchShapeError, match=says):
        call(d)
    assert d["y"] == before["y"] and torch.equal(d["x"], before["x"])  # nothing changed


def test_integral_values_of_any_type_are_taken():
    import numpy as np
    d = BatchedDataDict({"x": torch.arange(4), "y": [10, 11, 12, 13]})
    assert d.slice(np.int64(1), torch.tensor(3))["y"] == [11, 12]
    assert d.select_indices(np.array([3, 0]))["y"] == [13, 10]
    assert d.repeat_interleave(np.int32(2))["y"] == [10, 10, 11, 11, 12, 12, 13, 13]
    d.reorder_data(torch.tensor([3, 2, 1, 0]))
    assert d["y"] == [13, 12, 11, 10]

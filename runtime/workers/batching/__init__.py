"""Helpers behind runtime.workers.batched.BatchedDataDict, one concern per module.

rows: row counts, row selection and the error a mis-shaped batch raises; packed_tensor: PackedTensor;
media: which multimodal values may be shared between repeated rows; packing: bin packers for
sequence packing; plans: which rows go to which shard and micro-batch; stacking: from_batches;
collectives: all_gather across a process group; args: the TypedDicts that configure sharding.
"""

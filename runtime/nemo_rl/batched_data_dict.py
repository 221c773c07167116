"""nemo_rl.distributed.batched_data_dict's names, from runtime.workers.batched (already NeMo RL-compatible)."""
from runtime.workers.batched import (BatchedDataDict, BatchShapeError, DynamicBatchingArgs, PackedTensor,  # noqa: F401
                             SequencePackingArgs, SlicedDataDict)

__all__ = ["BatchedDataDict", "SlicedDataDict", "DynamicBatchingArgs", "SequencePackingArgs", "PackedTensor",
           "BatchShapeError"]

"""nemo_rl.distributed.named_sharding's NamedSharding, from runtime.workers.named_sharding."""
from runtime.workers.named_sharding import NamedSharding  # noqa: F401

__all__ = ["NamedSharding"]

"""How a worker group's call data reaches the workers.

- Data every worker gets (run_all_workers_single_data) is put in the object store once and every
  worker is handed the same ObjectRef; Ray resolves it before the method runs (without this, Ray
  serialises an argument once per worker).
- Shards (run_all_workers_multiple_data, run_all_workers_sharded_batch) are put once each, one
  ObjectRef per worker.
- CPU tensors are put zero-copy: their bytes go out-of-band (a pickle 5 buffer over the tensor's
  memory; numpy is not needed), and a worker maps them from its node's shared memory instead of
  copying. Such a tensor is READ-ONLY: it aliases the object store (`.clone()` it before changing it
  in place).
- ShardLoader: nothing is shipped; each worker calls `fn(rank, world_size, *args, **kwargs)` and
  passes what it returns to the method (data loaded where it is used, as torchrun ranks do).
"""
from __future__ import annotations

import ctypes
import pickle
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray
import torch

try:  # not a dependency of the images; arrays are only recognised where it is installed
    import numpy as np
    _ARRAYS: tuple = (np.ndarray,)
except ImportError:
    _ARRAYS = ()

from runtime.errors import InputError
from runtime.workers.batched import BatchedDataDict

_lock = threading.Lock()


def _tensor_from_buffer(buf, dtype: str, shape: tuple) -> torch.Tensor:
    """A tensor over the buffer's memory (the object store's, out-of-band: no copy)."""
    with warnings.catch_warnings():  # the buffer is read-only: torch warns once per process otherwise
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(buf, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def _reduce_tensor(t: torch.Tensor):
    nbytes = t.numel() * t.element_size()
    if (t.device.type != "cpu" or t.requires_grad or not t.is_contiguous() or t.is_sparse or t.is_quantized
            or nbytes == 0 or type(t) is not torch.Tensor):
        return t.__reduce_ex__(5)  # torch's own pickling, with a copy
    raw = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())  # read while `t` is alive (inside the put)
    return _tensor_from_buffer, (pickle.PickleBuffer(memoryview(raw).cast("B")), str(t.dtype).split(".")[-1], tuple(t.shape))


@contextmanager
def zero_copy_tensors():
    """While inside, Ray serialises plain CPU tensors as out-of-band pickle-5 buffers (no pickled copy).
    Only this process's serialisation is affected, and a reducer the user registered is kept."""
    from ray.cloudpickle import CloudPickler
    with _lock:
        previous = CloudPickler.dispatch.get(torch.Tensor)
        if previous is not None:  # the user's (or RAY_ENABLE_ZERO_COPY_TORCH_TENSORS') choice wins
            yield
            return
        CloudPickler.dispatch[torch.Tensor] = _reduce_tensor
        try:
            yield
        finally:
            CloudPickler.dispatch.pop(torch.Tensor, None)


def worth_putting(value: Any) -> bool:
    """Data (tensors, arrays, batches, bytes, or containers of them) goes through the object store;
    small plain values stay inline in the call, where Ray sends them faster."""
    if isinstance(value, (torch.Tensor, BatchedDataDict, *_ARRAYS)):
        return True
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value) >= 100_000
    if isinstance(value, dict):
        return any(worth_putting(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(worth_putting(v) for v in value[:64])
    return False


def put(value: Any) -> Any:
    """`value` as an ObjectRef if it is data (put once, zero-copy tensors), else `value` itself."""
    if isinstance(value, ray.ObjectRef) or not worth_putting(value):
        return value
    with zero_copy_tensors():
        return ray.put(value)


def put_each(values: list) -> list:
    """One put per item (each item is one worker's), under one zero-copy scope."""
    with zero_copy_tensors():
        return [v if isinstance(v, ray.ObjectRef) or not worth_putting(v) else ray.put(v) for v in values]


@dataclass(frozen=True)
class ShardLoader:
    """`fn(rank, world_size, *args, **kwargs)` run on each worker to make or read its own shard.
    `fn` must be importable by the workers or picklable (a module-level function is both)."""
    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, fn: Callable, *args, **kwargs):
        if not callable(fn):
            raise TypeError(f"ShardLoader needs a callable fn(rank, world_size, ...), got {fn!r}")
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)

    def __call__(self, rank: int, world_size: int):
        return self.fn(rank, world_size, *self.args, **self.kwargs)


def per_worker(values: Any, name: str, count: Optional[int] = None) -> None:
    """VALUES holds one item per worker: a list or tuple (not text, which would be split into its
    characters, nor None or a mapping), COUNT items long when given; else one line naming NAME."""
    from collections.abc import Sequence
    if isinstance(values, (str, bytes, bytearray)) or not isinstance(values, Sequence):
        raise InputError(f"{name}: a {type(values).__name__} ({str(values)[:40]!r}) is not a list with one item "
                         "per worker")
    if count is not None and len(values) != count:
        raise InputError(f"{name}: {len(values)} items for {count} workers; give one item per worker")

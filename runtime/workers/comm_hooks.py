"""Gradient compression for DDP: torch's communication hooks, registered on the worker's model.

A worker group created with enable_gradient_compression=<kind> sets RAYTRAIN_GRADIENT_COMPRESSION
in its workers; the worker calls compress_gradients(ddp_model) after wrapping its model.
"""
from __future__ import annotations

import os
from typing import Optional

COMPRESSIONS = ("fp16", "bf16", "powersgd")
COMPRESSION_ENV = "RAYTRAIN_GRADIENT_COMPRESSION"


def compress_gradients(model, kind: Optional[str] = None, process_group=None):
    """Register torch's DDP communication hook for gradient compression on a DDP model: fp16 or bf16
    compression, or PowerSGD. `kind` defaults to what the group was created with
    (enable_gradient_compression); returns the kind registered, or None when compression is off."""
    kind = kind or os.environ.get(COMPRESSION_ENV) or None
    if kind is None:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if kind == "fp16":
        model.register_comm_hook(process_group, default_hooks.fp16_compress_hook)
    elif kind == "bf16":
        model.register_comm_hook(process_group, default_hooks.bf16_compress_hook)
    elif kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"gradient compression {kind!r} is not one of {', '.join(COMPRESSIONS)}")
    return kind

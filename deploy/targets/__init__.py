"""The deploy targets, one module each behind one protocol (deploy.targets.base.Target).

Adding a target: a module with a `TARGET` and its line here.
"""
from __future__ import annotations

from deploy import handles
from deploy.handles import Handle
from deploy.job import DeployError
from runtime.errors import InputError
from deploy.targets import k8s, local, pyxis, skypilot, slurm
from deploy.targets.base import Target

TARGETS: dict[str, Target] = {m.TARGET.name: m.TARGET for m in (local, slurm, pyxis, k8s, skypilot)}
HOLDING: list[str] = [n for n, t in TARGETS.items() if t.holds_clusters]  # invoke up/run/status/down


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise DeployError(f"--target: {str(name)[:40]!r} is not one of {', '.join(TARGETS)}") from None


def check_handle(target: str, raw: object, where: str, name: str | None = None) -> Handle:
    """RAW as the handle of a cluster TARGET holds (deploy/handles.py check); InputError naming the field, or
    saying that TARGET holds no clusters."""
    model = TARGETS[target].handle if target in TARGETS else None
    if model is None:
        raise InputError(f"{where}: target {target[:40]!r} holds no clusters ({', '.join(HOLDING)} do)")
    return handles.check(model, raw, where, name)

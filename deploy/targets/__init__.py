"""The deploy targets, one module each behind one protocol (deploy.targets.base.Target).

Adding a target: a module with a `TARGET` and its line here.
"""
from __future__ import annotations

from deploy.job import DeployError
from deploy.targets import k8s, local, pyxis, skypilot, slurm
from deploy.targets.base import Target

TARGETS: dict[str, Target] = {m.TARGET.name: m.TARGET for m in (local, slurm, pyxis, k8s, skypilot)}
HOLDING: list[str] = [n for n, t in TARGETS.items() if t.holds_clusters]  # invoke up/run/status/down


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise DeployError(f"--target: {str(name)[:40]!r} is not one of {', '.join(TARGETS)}") from None

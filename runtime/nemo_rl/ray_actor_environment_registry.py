"""NeMo RL's actor-environment registry (nemo_rl.distributed.ray_actor_environment_registry).

NeMo RL maps each actor class (by fully qualified name) to the uv environment it must run in, and
refuses to start an actor that is not registered. This runtime has one interpreter per image (see
PY_EXECUTABLES), so the registry starts empty and an actor that is not registered runs on
PY_EXECUTABLES.SYSTEM. A registered value is honoured where it means something here: another
interpreter's path becomes the actor's runtime_env py_executable; a `uv run ...` command (a
per-actor environment to build) is refused by RayWorkerGroup with an explanation.
"""
from __future__ import annotations

from runtime.nemo_rl.virtual_cluster import PY_EXECUTABLES

__all__ = ["ACTOR_ENVIRONMENT_REGISTRY", "PY_EXECUTABLES", "get_actor_python_env"]

ACTOR_ENVIRONMENT_REGISTRY: dict[str, str] = {}


def get_actor_python_env(actor_class_fqn: str) -> str:
    """The interpreter `actor_class_fqn`'s actors run on: its registry entry, else the image's."""
    return ACTOR_ENVIRONMENT_REGISTRY.get(actor_class_fqn, PY_EXECUTABLES.SYSTEM)

"""Ray Train's defaults in a driver this runtime starts: checkpoints on the job's shared fileroot.

Ray Train keeps a run's results and checkpoints under `RunConfig.storage_path`, by default
`~/ray_results` on the driver's own disk, which a worker on another node cannot write and which goes
with the head's container. The launcher gives every process of the job STORAGE_ENV
(`<fileroot>/ray_results/<job name>`) and RUN_ENV (the run's id, which `--resume`, a requeue and a
replaced pod keep); a driver started through runtime/cluster/preload.py (a deploy's `python ...`
driver, and a held cluster's) then finds, when it imports Ray Train:
  - `ray.train.constants.DEFAULT_STORAGE_PATH` set to STORAGE_ENV, so `RunConfig()` with no
    storage_path writes there;
  - a `RunConfig` with no name named by the run id, so the same run (resumed, requeued) finds its
    checkpoints again (`ray.train.get_checkpoint()` in the training function).
A storage_path or name the script gives stays its own. Nothing is imported for this: the settings are
applied as Ray Train's modules load (a post-import hook), and not at all without STORAGE_ENV.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Callable

STORAGE_ENV = "RAYTRAIN_RAY_TRAIN_STORAGE"
RUN_ENV = "RAYTRAIN_RUN_ID"
_CONFIG_MODULES = ("ray.train.v2.api.config", "ray.air.config")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs HOOKS[name](module) right after the module `name` has executed."""

    def __init__(self, hooks: dict[str, Callable]):
        self.hooks = hooks

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            hook(module)
        spec.loader.exec_module = exec_module
        return spec


def _storage(path: str) -> Callable:
    def hook(module) -> None:
        module.DEFAULT_STORAGE_PATH = path
    return hook


def _named(run_id: str) -> Callable:
    def hook(module) -> None:
        config = getattr(module, "RunConfig", None)
        original = getattr(config, "__post_init__", None)
        if config is None or original is None:
            return

        def __post_init__(self) -> None:
            if getattr(self, "name", None) is None:
                self.name = run_id
            original(self)
        config.__post_init__ = __post_init__
    return hook


def install(env: dict | None = None) -> bool:
    """Apply the defaults to Ray Train in this process when it loads (or now, if it has); whether any."""
    env = os.environ if env is None else env
    storage = env.get(STORAGE_ENV)
    if not storage:
        return False
    hooks: dict[str, Callable] = {"ray.train.constants": _storage(storage)}
    run_id = env.get(RUN_ENV)
    if run_id:
        hooks.update({name: _named(run_id) for name in _CONFIG_MODULES})
    for name, hook in list(hooks.items()):
        if name in sys.modules:
            hook(sys.modules[name])
            del hooks[name]
    if hooks:
        sys.meta_path.insert(0, _AfterImport(hooks))
    return True

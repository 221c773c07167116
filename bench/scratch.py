"""The settings a benchmark builds a scratch copy of the example project with (toolchain's
scratch_settings: its own build directory, the user cache's wheels), and the spec it uses.
Benchmarks import this, never the tests' helpers."""
from __future__ import annotations

from pathlib import Path

import docker
from typing import Optional

from toolchain.config import Settings, scratch_settings

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "cluster_specs" / "local.json"


def make_settings(workdir: Path, app_dir: Path, registry_address: str = "127.0.0.1:5055",
                  runtime_dir: Optional[Path] = None) -> Settings:
    """A scratch project at WORKDIR with APP_DIR as its code; its own local registry's data beside it."""
    registry = {"address": registry_address, "data_dir": str(workdir.parent / "registry-data"), "retry_backoff_s": 0.2}
    return scratch_settings(ROOT, workdir, app_dir, SPEC, registry, runtime_dir)


def forget_pulls(registry: str) -> None:
    """Drop the engine's references to a bench registry's images (a push makes its digest resolve here by a
    pull: toolchain/publish/push.py); the layers stay with the local images that share them."""
    client = docker.from_env()
    for image in client.images.list():
        for ref in image.attrs.get("RepoDigests") or []:
            if ref.startswith(f"{registry}/"):
                try:
                    client.images.remove(ref)
                except docker.errors.APIError:
                    pass

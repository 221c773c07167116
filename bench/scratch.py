"""The settings a benchmark builds a scratch copy of the example project with (toolchain's
scratch_settings: its own build directory, the user cache's wheels), and the spec it uses.
Benchmarks import this, never the tests' helpers."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from toolchain.config import Settings, scratch_settings

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "cluster_specs" / "local.json"


def make_settings(workdir: Path, app_dir: Path, registry_address: str = "127.0.0.1:5055",
                  runtime_dir: Optional[Path] = None) -> Settings:
    """A scratch project at WORKDIR with APP_DIR as its code; its own local registry's data beside it."""
    registry = {"address": registry_address, "data_dir": str(workdir.parent / "registry-data"), "retry_backoff_s": 0.2}
    return scratch_settings(ROOT, workdir, app_dir, SPEC, registry, runtime_dir)

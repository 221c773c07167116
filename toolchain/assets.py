"""What the toolchain ships beside its code: the Dockerfile templates, the cluster specs with their
schema, and the example project (`raytrain init --example`).

In an installed wheel they are package data under toolchain/assets/ (pyproject.toml maps them there);
in a checkout (an editable install) they are the repository's own top-level folders.
"""
from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "assets"
_CHECKOUT = Path(__file__).resolve().parent.parent
_IN_CHECKOUT = {"dockerfiles": "dockerfiles", "cluster_specs": "cluster_specs", "example": "examples/train"}


def path(name: str) -> Path:
    """The directory of the asset NAME: dockerfiles, cluster_specs or example."""
    packaged = _PACKAGED / name
    return packaged if packaged.is_dir() else _CHECKOUT / _IN_CHECKOUT[name]

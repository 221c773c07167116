"""Free space, asked before each big write of a .sqsh conversion, with a stated margin.

A conversion writes gigabytes (an extracted image, a squashfs, a copy of the cached squashfs), and
a filled disk takes down whatever else shares it. Each big write first asks `room()`: the write's
size plus MARGIN must be free, or it is not started (a required write raises with the numbers and
the fix; an optional one, the background spare copy, is skipped with a note).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from deploy.job import DeployError

MARGIN_BYTES = 2 * 2**30  # left free after every write this module allows


def gib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 / 10 else f"{n / 2**30:.1f} GiB"


def free_bytes(where: Path) -> int:
    path = Path(where)
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def room(where: Path, need: int) -> bool:
    return free_bytes(where) >= need + MARGIN_BYTES


def require(where: Path, need: int, what: str) -> None:
    """Raise before a write of `need` bytes that would leave less than the margin free."""
    free = free_bytes(where)
    if free < need + MARGIN_BYTES:
        raise DeployError(f"{what} needs {gib(need)} in {where} and {gib(MARGIN_BYTES)} left free after it; "
                          f"{gib(free)} is free. Free some space (old digests in that directory: every .sqsh is "
                          f"named by its digest and can be deleted when no job uses it), or convert elsewhere")

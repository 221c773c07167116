"""The command a hint names: the program the user ran (`raytrain` or `invoke`), so that following a
hint runs the same tool with the same configuration."""
from __future__ import annotations

import os
import sys


def program() -> str:
    """`raytrain` when the user ran it (its console script), else `invoke` (tasks.py through Invoke)."""
    return "raytrain" if os.path.basename(sys.argv[0] or "") == "raytrain" else "invoke"


def cmd(rest: str) -> str:
    """`<program> REST`, as a user would type it."""
    return f"{program()} {rest}"

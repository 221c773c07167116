"""The command a hint names: the program the user ran (`raytrain` or `invoke`), so that following a
hint runs the same tool with the same configuration."""
from __future__ import annotations

import os
import sys


def program() -> str:
    """`raytrain` when the user ran it (its console script, or `python -m toolchain.cli`), else `invoke`
    (a checkout's tasks.py through Invoke)."""
    argv0 = (sys.argv[0] or "").replace(os.sep, "/")
    return "raytrain" if os.path.basename(argv0) == "raytrain" or argv0.endswith("toolchain/cli.py") else "invoke"


def cmd(rest: str) -> str:
    """`<program> REST`, as a user would type it."""
    return f"{program()} {rest}"

"""The one error boundary: what a user can cause becomes one line with the fix and an exit code;
anything else is a bug, shown with its traceback and a line saying so.

    explain(exc) -> Failure | None     # None: not the user's doing (a bug)

Used by every task (tasks._run) and around Invoke's own configuration loading (toolchain.cli).
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Optional

from runtime.errors import RaytrainError, os_message

EXIT_USAGE = 2
EXIT_BUG = 70  # EX_SOFTWARE: an internal error, not the user's input

BUG_LINE = ("raytrain: this is a bug in raytrain, not in your input; please report it with the traceback "
            "above and the command you ran")


@dataclass(frozen=True)
class Failure:
    message: str
    code: int


class ConfigFileError(RaytrainError):
    """A configuration file Invoke could not read or merge (syntax, file type, shape)."""

    exit_code = EXIT_USAGE


def explain(exc: BaseException) -> Optional[Failure]:
    """The one line a user-caused failure gets, or None for a bug."""
    if isinstance(exc, RaytrainError):
        return Failure(f"error: {exc}", exc.exit_code)
    if isinstance(exc, OSError) and exc.errno is not None:
        return Failure(f"error: {os_message(exc)}", EXIT_USAGE)
    return None


def report_bug(exc: BaseException) -> int:
    """Print the traceback and the bug line; the exit code to end with."""
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(BUG_LINE, file=sys.stderr, flush=True)
    return EXIT_BUG

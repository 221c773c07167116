"""The one error boundary: what a user can cause becomes one line with the fix and an exit code;
anything else is a bug, shown with its traceback and a line saying so.

    explain(exc) -> Failure | None     # None: not the user's doing (a bug)

Used by every task (tasks._run) and around Invoke's own configuration loading (toolchain.cli).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
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


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM (a CI runner's cancel, `kill`, a terminal closed) ends the task as Ctrl-C does: through
    every `finally`, so what it started (a local job's containers and network, a registry) is removed.
    Python's default for SIGTERM ends the process on the spot and left them running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(sig, _frame):
        raise SystemExit(128 + sig)
    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

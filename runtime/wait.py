"""One wait: poll a condition until it holds, with a deadline whose error says what was awaited,
carries the logs that explain it, and says what to check.

    wait_until(lambda: port_open(host, port), timeout_s=30, what=f"{host}:{port} to open",
               hint="is the head up?", logs=lambda: tail(log_file))

`check` returns a truthy value when done (returned to the caller) or raises to fail at once (a
process that exited, a node that died). Used by the launcher, the registry and the test clusters.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

from runtime import numbers
from runtime.errors import RaytrainError

T = TypeVar("T")


class WaitTimeout(RaytrainError):
    """The condition did not hold in time; the message names it, the hint and the log tail."""


def wait_until(check: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.2,
               hint: str = "", logs: Optional[Callable[[], str]] = None,
               on_timeout: Optional[Callable[[], BaseException]] = None) -> T:
    # a NaN deadline never passes and inf overflows sleep: the one bound every caller's timeout meets
    timeout_s = numbers.finite(timeout_s, f"timeout for {what}", 0, 7 * 86400)
    interval_s = numbers.finite(interval_s, f"poll interval for {what}", 0, 3600, low_open=True)
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            if on_timeout is not None:
                raise on_timeout()
            text = f"waited {timeout_s:.0f}s for {what}" + (f"; {hint}" if hint else "")
            tail = logs() if logs else ""
            raise WaitTimeout(text + (f"\n  last log lines:\n    {tail}" if tail else ""))
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


def holds_within(check: Callable[[], object], *, timeout_s: float, what: str, interval_s: float = 0.2) -> bool:
    """Whether CHECK came true within TIMEOUT_S, with wait_until's bounds and pacing: for the waits
    whose timeout has a fallback of its own (a signal, a cancel, a kill), not an error."""
    try:
        return bool(wait_until(check, timeout_s=timeout_s, what=what, interval_s=interval_s))
    except WaitTimeout:
        return False

"""Every line the workers printed so far, shown by the driver before what it prints next (its summary).

Ray forwards a worker's output to the driver through its log monitor, which tails the worker's log
files on its node and publishes them in batches: a worker's line reaches the driver a moment after
it was printed (seconds, on a busy node), while the driver's own prints appear at once. So a
summary printed right after the last step comes before the ranks' last steps, which then trail it.

flush() has each worker print a marker line on its stdout and its stderr, then watches the
driver's own two streams until every marker has come through, and leaves the markers out. A
worker's log file is read in order, so its marker arriving means every line it printed before did.
The marker is letters only: Ray's log deduplication, where it is on, folds lines that differ only
in their digits, and would fold the markers of different ranks into one. (With it on, the user's own
repeated lines are held back for seconds and shown folded later whatever this does: the launcher
turns it off, RAY_DEDUP_LOGS=0, for every driver it starts.)
"""
from __future__ import annotations

import secrets
import sys
import threading
import time
from typing import Optional

import ray

MARK = "raytrain-output-mark"
_LETTERS = str.maketrans("0123456789abcdef", "ghijklmnopqrstuv")


def _word(text: str) -> str:
    """Digits (and hex digits) as letters, so that no two markers differ in their digits only."""
    return text.translate(_LETTERS)


def marker(token: str, rank: int) -> str:
    return f"{MARK} {token} {_word(str(rank))}"


def forwarding() -> Optional[bool]:
    """Whether Ray forwards the workers' output to this driver (ray.init's log_to_driver); None when
    this Ray does not say (then the markers are waited for, up to the timeout)."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    global_worker = getattr(worker, "global_worker", None)
    if global_worker is None or not ray.is_initialized():
        return None
    return getattr(global_worker, "logger_thread", None) is not None


class _Watch:
    """Stands in for one of the driver's streams while the markers are awaited: whole lines pass
    through to the real stream, marker lines of this flush are noted and left out."""

    def __init__(self, real, token: str, ranks: dict[str, int]):
        self.real, self._token = real, f"{MARK} {token} "
        self._ranks = ranks  # a rank's word -> the rank
        self.pending = set(ranks.values())
        self.done = threading.Event()
        self._buf = ""
        self._lock = threading.Lock()
        if not self.pending:
            self.done.set()

    def write(self, text: str) -> int:
        with self._lock:
            self._buf += text
            whole, end, self._buf = self._buf.rpartition("\n")
            if not end:  # no line ended yet: rpartition left it all in _buf
                return len(text)
            shown = []
            for line in (whole + end).splitlines(keepends=True):
                at = line.find(self._token)
                if at < 0:
                    shown.append(line)
                    continue
                rank = self._ranks.get(line[at + len(self._token):].strip())
                self.pending.discard(rank)
                if not self.pending:
                    self.done.set()
            if shown:
                self.real.write("".join(shown))
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def release(self) -> None:
        """What is left of a line without its end goes to the real stream."""
        with self._lock:
            if self._buf:
                self.real.write(self._buf)
                self._buf = ""
        self.real.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding...: the real stream's
        return getattr(self.real, name)


def flush(hosts: list, timeout_s: float = 10.0) -> list[int]:
    """Wait until the lines every host (rank i = hosts[i]) printed before this call have been shown by
    this driver. Returns the ranks whose lines were still on their way after timeout_s (none,
    normally; every rank when the workers' output is not forwarded here, without waiting)."""
    if not hosts:
        return []
    if forwarding() is False:
        return list(range(len(hosts)))
    token = _word(secrets.token_hex(6))
    ranks = {_word(str(r)): r for r in range(len(hosts))}
    watches = {"stdout": _Watch(sys.stdout, token, ranks), "stderr": _Watch(sys.stderr, token, ranks)}
    sys.stdout, sys.stderr = watches["stdout"], watches["stderr"]
    deadline = time.monotonic() + timeout_s
    try:
        refs = [h.mark_output.remote(marker(token, r)) for r, h in enumerate(hosts)]
        try:
            ray.get(refs, timeout=timeout_s)
        except Exception:  # a lost or stuck host: its marker never comes, and it is reported late below
            pass
        for watch in watches.values():
            watch.done.wait(max(0.0, deadline - time.monotonic()))
    finally:
        sys.stdout, sys.stderr = watches["stdout"].real, watches["stderr"].real
        for watch in watches.values():
            watch.release()
    return sorted(set().union(*(w.pending for w in watches.values())))

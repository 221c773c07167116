"""Progress and result output: a progress bar on a terminal, plain lines in CI logs, nothing but
errors in quiet mode."""
from __future__ import annotations

import sys
import threading
import time


class Reporter:
    """One per command, shared by the threads of its steps (a build writes the base, the wheels and the
    layers at once): each line reaches the stream in one write, under one lock, so no two run together."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def step(self, msg: str) -> None:
        if not self.quiet:
            self._write(f"[{time.monotonic() - self._t0:6.1f}s] {msg}\n")

    def detail(self, msg: str) -> None:
        if not self.quiet:
            self._write(f"          {msg}\n")

    def warn(self, msg: str) -> None:
        self.progress_done()
        self._write(f"WARNING: {msg}\n")

    def progress(self, what: str, done: int, total: int | None = None) -> None:
        """A bar redrawn in place on a terminal; a plain line at most every 5 s otherwise (CI logs)."""
        if self.quiet:
            return
        tty = getattr(self.stream, "isatty", lambda: False)()
        now = time.monotonic()
        if getattr(self, "_progress_what", None) != what:  # a new bar: its rate counts from here
            self._progress_what, self._progress_t0, self._last_progress = what, now, now
            return
        if now - self._last_progress < (0.2 if tty else 5.0):
            return
        self._last_progress = now
        rate = f", {human_bytes(done / max(now - self._progress_t0, 1e-6))}/s"
        if tty:
            frac = min(1.0, done / total) if total else 0.0
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            of = f" / {human_bytes(total)}" if total else ""
            self._write(f"\r          {what} [{bar}] {human_bytes(done)}{of}{rate}")
            self._bar_open = True
        else:
            of = f" of {human_bytes(total)}" if total else ""
            self._write(f"          {what}: {human_bytes(done)}{of}{rate}\n")

    def progress_done(self) -> None:
        self._progress_what = None
        if getattr(self, "_bar_open", False):
            self._write("\n")
            self._bar_open = False


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"

"""Progress and result output: plain lines for humans, nothing but errors in quiet mode."""
from __future__ import annotations

import sys
import time


class Reporter:
    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self._t0 = time.monotonic()

    def step(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self._t0:6.1f}s] {msg}", file=self.stream, flush=True)

    def detail(self, msg: str) -> None:
        if not self.quiet:
            print(f"          {msg}", file=self.stream, flush=True)

    def warn(self, msg: str) -> None:
        print(f"WARNING: {msg}", file=self.stream, flush=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"

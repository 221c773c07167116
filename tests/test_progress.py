"""toolchain/progress.py: what a command prints while its steps run in threads of their own."""
from __future__ import annotations

import re
import threading
import time

from toolchain.progress import Reporter


class SlowStream:
    """A stream whose every write takes a moment, as a pipe to a busy reader does: a line written in
    two pieces (the text, then its newline) gives another thread the time to write between them."""

    def __init__(self):
        self.pieces: list[str] = []

    def write(self, text: str) -> int:
        time.sleep(0.001)
        self.pieces.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_lines_from_threads_at_once_stay_whole():
    out = SlowStream()
    rep = Reporter(stream=out)
    start = threading.Barrier(4)

    def say(n: int) -> None:
        start.wait()
        for i in range(25):
            rep.step(f"thread {n} step {i}")
            rep.detail(f"thread {n} detail {i}")
    threads = [threading.Thread(target=say, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep.warn("done")
    lines = "".join(out.pieces).split("\n")
    assert lines[-1] == "" and lines[-2] == "WARNING: done"
    whole = re.compile(r"(\[ *[0-9.]+s\] thread [0-3] step [0-9]+|          thread [0-3] detail [0-9]+)")
    broken = [ln for ln in lines[:-2] if not whole.fullmatch(ln)]
    assert not broken, broken[:5]
    assert len(lines) - 2 == 4 * 25 * 2

"""Every line the workers printed so far, shown before what the driver prints next (its summary).

Ray forwards a worker's output through its log monitor, which tails the worker's log files on its
node and publishes them in batches: a worker's line is shown a moment after it was printed (seconds,
on a busy node), while the driver's own prints appear at once. So a summary printed right after the
last step comes before the ranks' last steps, which then trail it.

Ray shows a worker's lines in the process whose job started the worker: the driver for hosts it
started, the launcher's Ray agent for the warm hosts it started and a group adopted (most ranks of
a job, runtime.cluster.ray_agent). flush() has each rank print a marker line on its stdout and its
stderr and waits until every marker has been shown: seen on the driver's own streams, or recorded in
the GCS by the agent, whose streams watch for markers the whole job (watch_streams). A worker's log
file is read in order, so its marker shown means every line it printed before was. Markers are left
out wherever they pass.

The marker is letters only: Ray's log deduplication, where it is on, folds lines that differ only in
their digits, and would fold the markers of different ranks into one. (With it on, the user's own
repeated lines are held back for seconds and shown folded later whatever this does: the launcher
turns it off, RAY_DEDUP_LOGS=0, for every driver it starts.)
"""
from __future__ import annotations

import re
import secrets
import sys
import threading
import time
from typing import Callable, Optional

import ray

MARK = "raytrain-output-mark"
KV_PREFIX = "raytrain:output-mark:"
STREAMS = ("stdout", "stderr")
_LETTERS = str.maketrans("0123456789abcdef", "ghijklmnopqrstuv")


def _word(text: str) -> str:
    """Digits (and hex digits) as letters, so that no two markers differ in their digits only."""
    return text.translate(_LETTERS)


TOKEN_LETTERS = 12  # a flush's token: 6 random bytes as letters (_word), new for every flush
# a whole marker line as Ray shows it: its prefix `(name pid=N, ip=...) ` (colored or not), then the marker;
# a user's line that holds the words somewhere else is the user's
_MARKER_LINE = re.compile(rf"(?:\x1b\[[0-9;]*m)?(?:\([^()\n]*\)(?:\x1b\[[0-9;]*m)?[ \t]+)?"
                          rf"{MARK} ([g-v]{{{TOKEN_LETTERS}}}) ([g-p]{{1,20}})[ \t]*\r?\n?")
MAX_HELD = 64 << 10  # output without a newline held back at most this long: a marker line is far shorter


def new_token() -> str:
    return _word(secrets.token_hex(TOKEN_LETTERS // 2))


def marker(token: str, rank: int) -> str:
    return f"{MARK} {token} {_word(str(rank))}"


def parse(line: str) -> Optional[tuple[str, str]]:
    """(token, rank word) of a whole marker line (after Ray's prefix), else None."""
    m = _MARKER_LINE.fullmatch(line)
    return (m.group(1), m.group(2)) if m else None


class MarkerFilter:
    """A stream's stand-in: whole lines pass to the real stream; a marker line is left out and given to
    seen(token, rank word, stream name)."""

    def __init__(self, real, name: str, seen: Callable[[str, str, str], None]):
        self.real, self.name, self._seen = real, name, seen
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._buf += text
            whole, end, self._buf = self._buf.rpartition("\n")
            if not end:  # no line ended yet: rpartition left it all in _buf
                if len(self._buf) > MAX_HELD:  # too long to be a marker: it goes out as it is
                    self.real.write(self._buf)
                    self._buf = ""
                return len(text)
            shown = []
            for line in (whole + end).splitlines(keepends=True):
                mark = parse(line)
                if mark is None:
                    shown.append(line)
                    continue
                # the lines before the marker leave this process first (a pipe's buffer would hold them)
                self.real.write("".join(shown))
                self.real.flush()
                shown = []
                self._seen(*mark, self.name)
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


def _kv_key(token: str, word: str, stream: str) -> bytes:
    return f"{KV_PREFIX}{token}:{word}:{stream}".encode()


def watch_streams() -> None:
    """For a process that shows the output of workers it started for others (the launcher's Ray agent):
    from now on its stdout and stderr leave markers out and record each in the GCS, for the driver
    that waits for it."""
    from ray.experimental import internal_kv

    def seen(token: str, word: str, stream: str) -> None:
        try:
            internal_kv._internal_kv_put(_kv_key(token, word, stream), b"1", overwrite=True)
        except Exception:  # the GCS going away: the driver's wait ends at its timeout
            pass
    sys.stdout, sys.stderr = MarkerFilter(sys.stdout, "stdout", seen), MarkerFilter(sys.stderr, "stderr", seen)


def flush(hosts: list, timeout_s: float = 10.0, poll_s: float = 0.05) -> list[int]:
    """Wait until the lines every host (rank i = hosts[i]) printed before this call have been shown.
    Returns the ranks whose lines were still on their way after timeout_s (none, normally)."""
    if not hosts:
        return []
    from ray.experimental import internal_kv
    token = new_token()
    rank_of = {_word(str(r)): r for r in range(len(hosts))}
    pending = {(w, s) for w in rank_of for s in STREAMS}
    here: set = set()

    def seen(tok: str, word: str, stream: str) -> None:
        if tok == token:
            here.add((word, stream))
    filters = [MarkerFilter(sys.stdout, "stdout", seen), MarkerFilter(sys.stderr, "stderr", seen)]
    sys.stdout, sys.stderr = filters
    deadline = time.monotonic() + timeout_s
    prefix = f"{KV_PREFIX}{token}:"
    try:
        refs = [h.mark_output.remote(marker(token, r)) for r, h in enumerate(hosts)]
        try:
            ray.get(refs, timeout=timeout_s)
        except Exception:  # a lost or stuck host: its marker never comes, and it is reported late below
            pass
        while True:
            pending -= here
            if pending:  # shown by the agent (one listing a round, whatever the number of ranks)
                for key in internal_kv._internal_kv_list(prefix):
                    word, _, stream = key.decode()[len(prefix):].partition(":")
                    pending.discard((word, stream))
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
    finally:
        sys.stdout, sys.stderr = filters[0].real, filters[1].real
        for f in filters:
            f.release()
        try:
            internal_kv._internal_kv_del(prefix, del_by_prefix=True)
        except Exception:
            pass
    return sorted({rank_of[w] for w, _ in pending})

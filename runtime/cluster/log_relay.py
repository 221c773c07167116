"""The driver's output as the head's log: passed through unchanged on a terminal; in a file or a
scheduler's pipe, with ANSI escape sequences removed and the lines below that say nothing left out
(Ray's missing-metrics-agent line, torch's c10d hostname warning, gloo's connection count).

Ray colours some of what it prints in the driver whatever RAY_COLOR_PREFIX says (the green
"[repeated Nx across cluster]" of its log deduplication), and a job log is read with grep, less and
a browser, not a terminal. Each of the driver's streams is copied by a thread to the same stream of
this process, line by line, so the order within a stream is kept and nothing waits for a full buffer.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import IO, Callable, Optional

# CSI sequences (colours, cursor moves) and the two-byte escapes; text is never touched otherwise
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# The images carry Ray's minimal install, with no metrics agent, so the launcher turns metrics
# collection off (launch.ray_env sets this default). Ray still reports the missing agent now and then,
# once per node and later in longer jobs (ray-project/ray#59665): with collection off that line says
# nothing, and it is dropped. With collection on (an image with ray[default]) it is a real fault and stays.
METRICS_ENV, METRICS_DEFAULT = "RAY_enable_metrics_collection", "0"
METRICS_AGENT_MISSING = re.compile(rb"Failed to establish connection to the (?:event\+)?metrics exporter agent")


# torch's TCPStore names each client in its own log by a reverse lookup of the client's address; where
# no resolver answers (a container on an offline host: err=-3, EAI_AGAIN) it warns once per connection
# and uses the address itself. Nothing about the connection is wrong, and no setting but muting every
# C++ warning of torch (TORCH_CPP_LOG_LEVEL) turns it off; this line only is dropped.
C10D_HOSTNAME = re.compile(rb"\[c10d\] The hostname of the client socket cannot be retrieved")
# gloo prints each rank's connection count to stdout when its group forms (an unconditional std::cout in
# gloo's tcp transport, so no setting turns it off): dropped when every peer is connected; a rank
# that is not (and gloo's "is NOT connected to" line after it) stays.
GLOO_CONNECTED = re.compile(rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. "
                            rb"Expected number of connected peer ranks is : (\d+)")


# Ray's prefix with nothing after it: a worker's output can hold an empty line (one showed up on rank 0
# at its first checkpoint), and Ray prints its prefix alone for it: a line that says nothing
EMPTY_WORKER_LINE = re.compile(rb"(?:\x1b\[[0-9;]*m)?\([^()\n]* pid=\d+(?:, ip=[^()\s]+)?\)(?:\x1b\[[0-9;]*m)?\s*")


# Ray Train's placement-group cleaner asks the state API (the dashboard's, which the images do not run)
# whether its controller lives, once every few seconds, and warns each time it cannot: said once, with
# what it means, then left out
STATE_API_MISSING = re.compile(rb"Failed to query Ray Train Controller actor state\. State API may be temporarily "
                               rb"unavailable")
STATE_API_NOTE = (b"[raytrain] (Ray Train's state-API check has no dashboard to ask here, so its placement groups "
                  b"are freed when the job ends; the warning above is not repeated)\n")


def dropped() -> Callable[[bytes], bool]:
    """Whether the relay leaves a line out: the lines above (the missing metrics agent's only while
    collection is off; the state API's after its first)."""
    metrics_off = os.environ.get(METRICS_ENV, METRICS_DEFAULT) == "0"
    said: set = set()

    def drop(line: bytes) -> bool:
        if metrics_off and METRICS_AGENT_MISSING.search(line):
            return True
        if STATE_API_MISSING.search(line):
            if "state-api" in said:
                return True
            said.add("state-api")
        if EMPTY_WORKER_LINE.fullmatch(line):
            return True
        gloo = GLOO_CONNECTED.search(line)
        return bool(C10D_HOSTNAME.search(line) or (gloo and gloo.group(1) == gloo.group(2)))
    return drop


def wanted() -> bool:
    """Relay (and strip) only when this process's stdout is not a terminal."""
    return not sys.stdout.isatty()


def streams() -> dict:
    """Popen keyword arguments for a driver whose output goes through relay()."""
    return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if wanted() else {}


def _copy(src: IO[bytes], dst: IO[bytes], close_dst: bool = False) -> None:
    writing, drop = True, dropped()
    try:
        for line in iter(src.readline, b""):
            if writing and not drop(line):
                try:
                    dst.write(ANSI.sub(b"", line))
                    if STATE_API_MISSING.search(line):
                        dst.write(STATE_API_NOTE)
                    dst.flush()
                except OSError:  # the reader went away (an interrupted client): keep draining, write no more
                    writing = False
    finally:
        src.close()
        if close_dst:
            dst.close()


def relay(proc: subprocess.Popen) -> list[threading.Thread]:
    """Start copying the process's piped streams; join the threads after it exits."""
    threads = []
    for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
        if src is not None:
            t = threading.Thread(target=_copy, args=(src, dst), daemon=True)
            t.start()
            threads.append(t)
    return threads


def relay_fds(stdout_fd: int, stderr_fd: int, out: Optional[IO[bytes]] = None,
              err: Optional[IO[bytes]] = None) -> list[threading.Thread]:
    """The same for a process started another way (forked by a zygote): the read ends of its pipes,
    copied to OUT and ERR (default: this process's own stdout and stderr)."""
    threads = []
    for fd, dst, given in ((stdout_fd, out or sys.stdout.buffer, out is not None),
                           (stderr_fd, err or sys.stderr.buffer, err is not None)):
        t = threading.Thread(target=_copy, args=(os.fdopen(fd, "rb"), dst, given), daemon=True)
        t.start()
        threads.append(t)
    return threads


def finish(threads: list[threading.Thread], timeout_s: Optional[float] = 10) -> None:
    """Wait for the last lines (a grandchild still holding the pipe is not waited for beyond timeout_s)."""
    for t in threads:
        t.join(timeout_s)


def prefixed(chunks, prefix: str, out) -> None:
    """Byte chunks (a container's log, an exec's or a step's output) to OUT as text lines, each with
    `[PREFIX] ` before it; colour codes (SkyPilot's, Ray's) are dropped unless OUT is a terminal."""
    buf = b""
    plain = not getattr(out, "isatty", lambda: False)()

    def text(line: bytes) -> str:
        return (ANSI.sub(b"", line) if plain else line).decode(errors="replace")
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            out.write(f"[{prefix}] {text(line)}\n")
            out.flush()
    if buf:
        out.write(f"[{prefix}] {text(buf)}\n")

"""The launcher's side of its Ray agent (runtime/cluster/ray_agent.py): the child it starts, the words of
their line protocol, named once for both ends, and reading them back.

On the status pipe the agent says (one line each):
    BARRIER <s>      head: every node is up; <s> since the last one registered
    PUBLISHED        head: the driver's exit code is in the GCS and the workers had their moment to leave
    EXIT <code>      follow: the head published the driver's exit code
    LOST <reason>    follow: the head's GCS stopped answering
    ERROR <message>  either: what failed, in words for the user
On the head agent's stdin the launcher says `EXIT <code>` once the driver has exited.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Optional

from runtime.cluster import lifeline, log_relay
from runtime.cluster.node_log import LaunchError
from runtime.cluster.ray_node import RayNode

BARRIER, PUBLISHED, EXIT, LOST, ERROR = "barrier", "published", "exit", "lost", "error"


def say(fd: int, word: str, rest: object = "") -> None:
    """The agent's side: one protocol line on the status pipe."""
    os.write(fd, (f"{word} {rest}".rstrip() + "\n").encode())


class RayAgent:
    """`python -m runtime.cluster.ray_agent ROLE ...` (runtime/cluster/ray_agent.py): everything that talks to Ray,
    in a child whose death this process reports instead of sharing. Lines come back on a pipe."""

    def __init__(self, address: str, env: dict, role: str, *args: str):
        r, w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cluster.ray_agent", "--status-fd", str(w),
                                      "--address", address, role, *args], env=env, stdin=subprocess.PIPE,
                                     pass_fds=(w,), preexec_fn=lifeline.tied_to_me(), **log_relay.streams())
        self.relayed = log_relay.relay(self.proc)  # the warm hosts' output reaches the log through the agent
        os.close(w)
        self.status = os.fdopen(r, "rb", buffering=0)  # unbuffered: select() sees every line not yet read

    def expect(self, word: str, node: RayNode, timeout_s: Optional[float] = None) -> str:
        """The rest of the agent's next line, which must start with `word`; LaunchError with the
        agent's own words (`error ...`), or with what ended it."""
        line = self.next_line(node, timeout_s)
        kind, _, rest = line.partition(" ")
        if kind == word:
            return rest
        if kind == ERROR:
            raise LaunchError(rest)
        if not line:
            code = self.proc.poll()
            if node.returncode is not None:
                raise LaunchError(f"this node's Ray exited ({node.returncode}) while waiting for {word!r}:\n    "
                                  f"{node.tail(5)}")
            raise LaunchError(f"the Ray agent ended ({'exit ' + str(code) if code is not None else 'no answer'}) "
                              f"before {word!r}; its output is above")
        raise LaunchError(f"the Ray agent said {line!r}, expected {word!r}")

    def next_line(self, node: RayNode, timeout_s: Optional[float]) -> str:
        """The agent's next line; "" when it ended, this node's Ray ended, or timeout_s passed."""
        import select
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ready, _, _ = select.select([self.status], [], [], 0.5)
            if ready:
                return self.status.readline().decode(errors="replace").strip()
            if node.returncode is not None or (deadline is not None and time.monotonic() > deadline):
                return ""

    def send(self, word: str, rest: object = "") -> None:
        """The launcher's side: one protocol line on the agent's stdin."""
        try:
            self.proc.stdin.write((f"{word} {rest}".rstrip() + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise LaunchError(f"the Ray agent is gone (exit {self.proc.poll()})") from None

    def stop(self, terminating: bool = False) -> None:
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:  # the node is being taken away (SIGTERM): no time for the agent to leave in order
            self.proc.wait(timeout=0.5 if terminating else 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        log_relay.finish(self.relayed, timeout_s=2)
        self.status.close()

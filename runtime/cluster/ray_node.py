"""This node's Ray: `ray start --block` as the launcher's child, started again when a start fails.

On a busy machine a node's Ray can fail to come up for reasons that pass: Ray waits a hard-coded
30 s for its raylet to register with the GCS (`ray/_private/node.py`: "The current node timed out
during startup"), a port is briefly still held, the GCS answers slowly. `start()` treats a start as
done only when `ray start` says so ("Ray runtime started.", printed after the raylet registered),
and tries again, with a line saying why, until the caller's deadline; only then does it give up, with
the last attempt's own words.

Stopping a node stops exactly its processes (its own process group), so several nodes can share a host.
Nodes that share one (several `slurmd -N nK` on a machine, `--port-stride`) start their Ray through a
`HostGate`: at most one start per core at once, each holding its slot until its node said it started and
SETTLE_S more. Sixteen nodes starting at once on 2 cores otherwise starve each other past Ray's own
start-up deadlines (the raylet's wait for its agents, the 30 s registration wait) and every start fails
again and again. One node per host, as on a real cluster, has no gate.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from runtime.cluster import lifeline
from runtime.errors import RaytrainError

STARTED_LINE = "Ray runtime started."  # Ray's own line once the node registered (ray/scripts/scripts.py)
ATTEMPT_S = 120          # one attempt that neither starts nor fails (Ray's own wait is 30 s)
BACKOFF_S = (1, 2, 4, 8)  # pauses between attempts, the last repeated
STOP_GRACE_S = 30        # `ray start --block` stopping its processes in order, on a normal exit
TERMINATE_GRACE_S = 2    # ... when the scheduler is taking the node (its own grace period is short)
SETTLE_S = 3             # a gated start keeps its slot this long after Ray said it started (its agents)


class StartFailed(RaytrainError):
    """This node's Ray did not come up within the deadline; the message has the last attempt's words."""


class HostGate:
    """At most SLOTS Ray starts at once on this host: each start takes a free one of SLOTS lock files in
    DIRECTORY (flock: a start that dies frees its slot with it) and waits while all are taken.

    The directory is the user's own: under $XDG_RUNTIME_DIR when there is one, else in the temp directory
    by the user's uid, made with mode 0700. Anyone may create a name in /tmp first, so it is checked when
    opened: a directory (not a link), owned by this user, that no one else may write. A slot is opened
    without following a link and used only if it is a regular file. Where any of that fails the start is
    not gated (`unusable` says why, once): gating only keeps starts from competing for the cores, it never
    decides whether one happens."""

    def __init__(self, directory: Path, slots: int):
        self.directory, self.slots = Path(directory), max(1, slots)
        self.unusable: Optional[str] = None

    @classmethod
    def shared_host(cls) -> "HostGate":
        runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
        if runtime_dir and os.path.isdir(runtime_dir) and _private_to_me(runtime_dir) is None:
            return cls(Path(runtime_dir) / "raytrain-start-gate", os.cpu_count() or 1)
        return cls(Path(tempfile.gettempdir()) / f"raytrain-start-gate-{os.getuid()}", os.cpu_count() or 1)

    def _ready(self) -> bool:
        """Whether the directory is this user's private one (made so if missing); else `unusable` says why."""
        try:
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            self.unusable = f"{self.directory} cannot be made ({e.strerror or e})"
            return False
        self.unusable = _private_to_me(self.directory)
        return self.unusable is None

    def _open_slot(self, i: int) -> Optional[int]:
        try:
            fd = os.open(self.directory / f"slot-{i}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError:
            return None  # a link, a directory: not a slot
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    @contextlib.contextmanager
    def slot(self, deadline: float) -> Iterator[bool]:
        """Hold a slot for the block; yields False when none came free before DEADLINE, or when the
        directory is not one to trust (the start goes ahead ungated rather than never)."""
        held = None
        ready = self._ready()
        while ready and held is None and time.monotonic() < deadline:
            for i in random.sample(range(self.slots), self.slots):
                fd = self._open_slot(i)
                if fd is None:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = fd
                    break
                except BlockingIOError:
                    os.close(fd)
            if held is None:
                time.sleep(random.uniform(0.1, 0.3))
        try:
            yield held is not None
        finally:
            if held is not None:
                os.close(held)  # closing the file drops the lock


def _private_to_me(directory) -> Optional[str]:
    """Why DIRECTORY is not this user's private directory (a link, not a directory, another owner, writable
    by others), or None when it is."""
    try:
        st = os.lstat(directory)
    except OSError as e:
        return f"{directory} cannot be read ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory (a link, or a file)"
    if st.st_uid != os.getuid():
        return f"{directory} belongs to uid {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"{directory} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


@dataclass
class RayNode:
    """One `ray start --block` and the file its output goes to (a pipe nobody reads would block it)."""
    proc: subprocess.Popen
    log_path: str

    @classmethod
    def spawn(cls, ray_cmd: list[str], args: list[str], env: dict) -> "RayNode":
        """`ray_cmd` is `[ray]`, or the zygote's stand-in for it (runtime.cluster.zygote)."""
        out = tempfile.NamedTemporaryFile(prefix="ray-start-", suffix=".log", delete=False)
        try:
            proc = subprocess.Popen([*ray_cmd, "start", "--block", *args], env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lifeline.tied_to_me())
        finally:
            out.close()
        return cls(proc, out.name)

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        return "\n    ".join(self.text().strip().splitlines()[-lines:])

    def cause(self) -> str:
        """The line that says why a start failed: Ray's exception, else its last line."""
        lines = [ln.strip() for ln in self.text().splitlines() if ln.strip()]
        for ln in reversed(lines):
            if ln.split(" ", 1)[0].endswith(("Error:", "Exception:")):
                return ln
        return lines[-1] if lines else "no output"

    def started(self) -> bool:
        """True once Ray says the node started; StartFailed if `ray start` exited first."""
        if self.proc.poll() is not None:
            raise StartFailed(f"ray start exited with {self.proc.returncode}: {self.cause()}")
        return STARTED_LINE in self.text()

    def stop(self, terminating: bool = False) -> None:
        """Stop this node's Ray; then whatever of its process group is left (a raylet that ended because
        its GCS was gone leaves its agents behind, orphaned, when `ray start` has already exited).
        `terminating`: the node is being taken away (SIGTERM), so it goes within seconds and the rest
        of the cluster sees it lost at once instead of when the scheduler's grace period ends."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=TERMINATE_GRACE_S if terminating else STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def _attempt(ray_cmd: list[str], args: list[str], env: dict, limit: float, settle_s: float) -> RayNode:
    """One `ray start`, until it says it started (then SETTLE_S more) or LIMIT seconds have passed."""
    began = time.monotonic()
    node = RayNode.spawn(ray_cmd, args, env)
    try:
        while not node.started():
            if time.monotonic() - began > limit:
                raise StartFailed(f"ray start did not say it started within {limit:.0f}s: {node.cause()}")
            time.sleep(0.1)
        settled = time.monotonic() + settle_s
        while time.monotonic() < settled and node.returncode is None:
            time.sleep(0.1)
        node.started()  # exited while settling: StartFailed with its words
    except BaseException:
        node.stop()
        raise
    return node


def start(ray_cmd: list[str], args: list[str], env: dict, *, timeout_s: float, what: str,
          say: Callable[[str], None], on_retry: Optional[Callable[[int, str], None]] = None,
          stop_if: Optional[Callable[[], Optional[str]]] = None, attempt_s: float = ATTEMPT_S,
          gate: Optional[HostGate] = None) -> RayNode:
    """This node's Ray, started; tried again after each failed attempt until `timeout_s` has passed.
    `say` gets one line per failed attempt; `on_retry(attempt, cause)` is called before the next one;
    `stop_if()` is asked first, and a reason it gives ends the tries (a worker whose head is gone).
    GATE: nodes sharing this host take turns (HostGate)."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        began = time.monotonic()
        try:
            with (gate.slot(deadline) if gate else contextlib.nullcontext(False)) as gated:
                if gate is not None and gate.unusable and attempt == 1:
                    say(f"{what}: not taking turns with this host's other nodes: {gate.unusable}")
                node = _attempt(ray_cmd, args, env, min(attempt_s, max(1.0, deadline - time.monotonic())),
                                SETTLE_S if gated else 0.0)
            if attempt > 1:
                say(f"{what} came up on attempt {attempt}")
            return node
        except StartFailed as e:
            cause = str(e)
        final = stop_if() if stop_if else None
        if final:
            raise StartFailed(f"{what} failed ({cause}); not trying again: {final}")
        # jittered (between the step and twice it): nodes whose starts failed together (a GCS or a host
        # too busy for Ray's own start-up deadlines) do not all come back at the same moment again
        pause = round(BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1] * random.uniform(1.0, 2.0), 1)
        left = deadline - time.monotonic()
        if left < pause + 5:  # no time left for another attempt to come up
            raise StartFailed(f"{what} failed {attempt} time(s) within {timeout_s:.0f}s; the last: {cause}")
        say(f"{what} failed (attempt {attempt}, after {time.monotonic() - began:.1f}s): {cause}; "
            f"trying again in {pause}s ({left:.0f}s left)")
        if on_retry:
            on_retry(attempt, cause)
        time.sleep(pause)

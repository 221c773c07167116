"""Ray worker processes forked from a node-local process that has already imported torch.

A Ray worker starts as a fresh interpreter running `default_worker.py`, and a rank then imports
torch: about 2.5 s of CPU per worker (this build of torch, with its CUDA libraries), paid on a node
that has just joined, after the barrier. Here the launcher starts, on every node and as soon as it
starts, a *zygote*: one process that imports torch (PRELOAD), then waits on a Unix socket. The
node's raylet is told to start its Python workers through a *trampoline* (runtime/cluster/trampoline.py): a
small stdlib-only script that hands its argv, environment, cwd and stdio to the zygote, which
forks; the child runs `default_worker.py` as the raylet's command (or `setup_worker.py`'s exec)
would have. The trampoline stays as the raylet's child and exits with the worker's status; a
signal it gets is passed on, and if it dies the zygote kills the worker. The raylet knows the
worker by the pid it registers with (the forked child), as it does for workers in containers.

Anything the trampoline cannot hand over as-is runs as Ray would run it without a zygote (it execs the real
interpreter with the same arguments): a runtime environment with a command prefix, another
py_executable or entrypoint, interpreter flags, a non-Python worker, the raylet's agents, no
zygote listening, or one not ready within 30 s (it listens from the start, so a worker
that starts while it imports waits for those imports rather than competing with them).

A fork shares the zygote's imported modules (and, copy-on-write, their memory); nothing else is
shared: no thread runs in the zygote (it checks before each fork; numpy's OpenBLAS is loaded with
one thread for that, so numpy's BLAS is single-threaded in forked workers, torch's own intra-op
threads are not affected), CUDA is never initialised there, and each child gets the environment the
raylet gave the trampoline.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

from runtime.cluster.preload import import_all, parse, run
from runtime.cluster.trampoline import EXIT, PID, REFUSED, protocol_line, python_for_raylet

# What a forked worker finds imported; one that fails to import is skipped (the worker imports it
# itself). Not ray: a worker forked after `import ray` fails Ray's own start-up check of RAY_JOB_ID
# (ray 2.60, core_worker.cc), so each worker imports ray itself. But most of `import ray` is the
# libraries Ray imports, and those carry no Ray state: with torch imported, `import ray` took 0.87 s in
# a container here, 0.56 s of it jsonschema's `referencing`, requests and urllib3, protobuf, attrs,
# PyYAML, filelock and psutil. They are imported here, so a driver or worker forked from the zygote
# pays only for Ray's own modules.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
RAY_LIBRARIES = ("jsonschema", "referencing", "requests", "urllib3", "google.protobuf", "attr", "attrs", "yaml",
                 "filelock", "psutil", "msgpack")  # one the image lacks is skipped without a word
# thread settings a fresh process reads when its libraries load; the zygote loads them without these,
# and each child applies its own (_apply_thread_env)
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_MAX_REQUEST = 16 * 2**20


# ---------------------------------------------------------------- `ray start` with the trampoline

def ray_main(trampoline: str, args: list[str]) -> int:
    """`ray ARGS`, except that the raylet it starts runs Python workers through `trampoline`.

    Ray builds the raylet's worker command from sys.executable inside `services.start_raylet`; only
    that call sees the trampoline (the GCS, dashboard and log monitor are started as usual, and the
    raylet's agents go through the trampoline's plain exec)."""
    from ray._private import services
    original = getattr(services, "start_raylet", None)
    if original is None:  # another Ray than the one this was written against (2.60): workers start plainly
        print("zygote: this Ray has no services.start_raylet; workers start without the zygote", file=sys.stderr)
    else:
        def start_raylet(*a, **kw):
            real, sys.executable = sys.executable, trampoline
            try:
                return original(*a, **kw)
            finally:
                sys.executable = real
        services.start_raylet = start_raylet
    from ray.scripts.scripts import main
    sys.argv = ["ray", *args]
    return main()


# ---------------------------------------------------------------- the zygote

def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


def _apply_thread_env(ray_worker: bool = True) -> None:
    """What OMP_NUM_THREADS would have done at load in a fresh process: now, and for a RAY_WORKER again
    when Ray sets it for the worker's first task (ray._private.utils.set_omp_num_threads_if_unset: the
    actor's CPUs, or 1), which in a fresh worker comes before the user's code imports torch."""
    def apply() -> None:
        value = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
        if "torch" in sys.modules and value and value.isdigit() and int(value) > 0:
            sys.modules["torch"].set_num_threads(int(value))
    apply()
    if not ray_worker:  # another program (a torchrun-style rank): Ray is not imported for it
        return
    import ray._private.utils as ray_utils
    original = ray_utils.set_omp_num_threads_if_unset

    def set_omp_num_threads_if_unset() -> bool:
        changed = original()
        apply()
        return changed
    ray_utils.set_omp_num_threads_if_unset = set_omp_num_threads_if_unset


# what the zygote's own start put on sys.path, which a fresh worker's would not have: its directory
# (`python -m` puts the cwd first) and its PYTHONPATH
_OWN_PATHS = [sys.path[0], *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]


def _apply_pythonpath(value: str) -> None:
    """PYTHONPATH as a new interpreter would read it: the worker's entries right after sys.path[0] (the
    script's directory, which preload.run sets), and none of the zygote's own start-up entries.
    The zygote started before the job did: a job's working_dir (Ray puts it on PYTHONPATH) is not on
    its sys.path yet, and the image's project directory is, which a held cluster's runs leave out
    (runtime/cluster/serving.py)."""
    entries = [p for p in value.split(os.pathsep) if p]
    for p in _OWN_PATHS + entries:
        while p in sys.path[1:]:
            sys.path.remove(p)
    for p in reversed(entries):
        sys.path.insert(1, p)


def _child(req: dict, fds: list[int]) -> None:
    """In the forked child: become the worker the raylet asked for. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)  # a process group of its own, as the raylet gives each worker: Ray kills the worker's group
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(req["env"])
        _apply_thread_env(ray_worker=os.path.basename(req["argv"][0]) == "default_worker.py")
        os.chdir(req["cwd"])
        _apply_pythonpath(req["env"].get("PYTHONPATH", ""))
        try:
            run(parse(req["argv"]))  # as `python default_worker.py ARGS` (or `python -m module ARGS`)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(socket_path: str, log=lambda m: print(m, file=sys.stderr, flush=True)) -> int:
    """Import PRELOAD, then fork a worker for each trampoline that connects, until SIGTERM."""
    t0 = time.monotonic()
    # bound before the imports: a worker that starts meanwhile waits in the backlog for them (they are
    # under way, and a second torch import beside them would only compete for the same cores)
    listener = _listen(socket_path)
    done = _preload(log)
    if not _single_threaded():
        log(f"zygote: {_threads()} threads after the imports; forking would not be safe, so workers start as usual")
        listener.close()
        os.unlink(socket_path)
        return 0
    log(f"zygote on {socket.gethostname()}: ready at {socket_path} after {time.monotonic() - t0:.2f}s ({', '.join(done)})")
    loop = _Loop(listener, log)
    try:
        loop.run()
    finally:
        loop.end_orphans()
        try:
            os.unlink(socket_path)
        except OSError:
            pass
    return 0


def _listen(socket_path: str) -> socket.socket:
    """The zygote's Unix socket, this user's only (the raylet's trampolines connect to it)."""
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    os.chmod(socket_path, 0o600)
    listener.listen(64)
    return listener


def _preload(log) -> list[str]:
    """Import PRELOAD (what could be imported: its names), then freeze what the imports made."""
    import gc
    # numpy's OpenBLAS (torch imports numpy) starts a thread server at load unless told to use one
    # thread; the children get their own environment back, but keep that one-thread BLAS
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for key in _THREAD_ENV:
        os.environ.pop(key, None)
    done = import_all(PRELOAD, lambda name, e: log(f"zygote: not preloaded: {name} ({type(e).__name__}: {e})"))
    import_all(RAY_LIBRARIES)
    gc.collect()
    gc.freeze()  # what the imports made stays out of the children's collections: fewer copied pages
    return done


def _single_threaded(wait_s: float = 2.0) -> bool:
    """Whether this process is down to one thread (the imports' thread is joined; the kernel drops its
    task a moment later): only then is forking safe."""
    deadline = time.monotonic() + wait_s
    while _threads() != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return _threads() == 1


class _Loop:
    """The zygote's event loop: accept a trampoline and fork its worker, reap workers and tell their
    trampolines the exit code, kill a worker whose trampoline hung up, stop on SIGTERM."""

    def __init__(self, listener: socket.socket, log):
        import selectors
        self.listener, self.log = listener, log
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.stop: list = []
        signal.signal(signal.SIGTERM, lambda *_: self.stop.append(1))
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")
        self.children: dict[int, socket.socket | None] = {}  # pid -> its trampoline (None: it hung up)

    def run(self) -> None:
        while not self.stop:
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "signal":
                    try:
                        os.read(self.wake_r, 512)
                    except BlockingIOError:
                        pass
                    self.reap()
                elif key.data == "accept":
                    conn, _ = self.listener.accept()
                    _serve_one(conn, self.sel, self.children, self.log,
                               inherited=(self.listener, self.wake_r, self.wake_w))
                else:
                    self.hung_up(key)
            self.reap()

    def reap(self) -> None:
        """Collect every worker that ended; tell its trampoline (if still there) its exit code."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(protocol_line(EXIT, f"{os.waitstatus_to_exitcode(status)} {time.time():.6f}"))
                except OSError:
                    pass
                self.sel.unregister(conn)
                conn.close()

    def hung_up(self, key) -> None:
        """A trampoline hung up (killed): its worker goes with it."""
        pid = key.data
        try:
            os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still this child's
        except ProcessLookupError:
            pass
        self.sel.unregister(key.fileobj)
        key.fileobj.close()
        self.children[pid] = None

    def end_orphans(self) -> None:
        """Workers still here when the zygote stops are orphans of a node going away (a normal stop ends
        them through their raylet first): SIGKILL, as a raylet ends its workers on the way out. A Ray
        worker sent SIGTERM without its raylet aborts in Ray's teardown (~CoreWorker -> std::terminate),
        and its "Fatal Python error: Aborted" with a native stack buried the one line that said why."""
        for pid in list(self.children):
            try:
                os.kill(-pid, signal.SIGKILL)  # the worker's own process group (_child), with whatever it started
            except ProcessLookupError:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _hung_up(conn: socket.socket) -> bool:
    import select
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _serve_one(conn: socket.socket, sel, children: dict, log, inherited: tuple) -> None:
    import selectors
    try:
        conn.settimeout(10)
        data, fds, _flags, _addr = socket.recv_fds(conn, 8 + _MAX_REQUEST, 3)
        if len(data) < 8:
            raise ValueError("short request")
        size = int.from_bytes(data[:8], "big")
        body = bytearray(data[8:])
        while len(body) < size:
            more = conn.recv(size - len(body))
            if not more:
                raise ValueError("truncated request")
            body += more
        req = json.loads(body)
        if len(fds) != 3:
            raise ValueError(f"expected 3 descriptors, got {len(fds)}")
    except (OSError, ValueError) as e:
        log(f"zygote: bad request ({e}); the trampoline starts the worker plainly")
        conn.close()
        return
    if _hung_up(conn):  # the trampoline gave up waiting and started the worker itself
        conn.close()
        for fd in fds:
            os.close(fd)
        return
    if _threads() != 1:
        conn.sendall(protocol_line(REFUSED, "threads"))
        conn.close()
        for fd in fds:
            os.close(fd)
        return
    pid = os.fork()
    if pid == 0:  # the child keeps none of the zygote's own descriptors
        sel.close()
        for f in (conn, *(c for c in children.values() if c is not None), *inherited):
            f.close() if hasattr(f, "close") else os.close(f)
        _child(req, fds)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    conn.settimeout(None)
    conn.sendall(protocol_line(PID, pid))
    sel.register(conn, selectors.EVENT_READ, pid)


class NodeZygote:
    """The zygote of one node, as the launcher holds it: started before Ray, stopped after it."""

    def __init__(self, directory: str, trampoline: str, socket_path: str, env: dict):
        import subprocess

        from runtime.cluster.lifeline import tied_to_me
        self.dir, self.trampoline, self.socket = directory, trampoline, socket_path
        # its own session (a signal to the launcher's group is not a signal to it), and it dies with the launcher
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cluster.zygote", "serve", "--socket", self.socket],
                                     env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=tied_to_me())

    def ray_argv(self) -> list[str]:
        """The command that stands for `ray` so that this node's raylet forks its workers here."""
        return [sys.executable, "-m", "runtime.cluster.zygote", "ray", self.trampoline, "--"]

    def stop(self) -> None:
        import shutil
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def start(env: dict, log) -> NodeZygote | None:
    """This node's zygote, or None (said through `log`) where the trampoline cannot run: a temp dir
    mounted noexec, as some sites mount /tmp (set TMPDIR to an executable place to have it)."""
    import shutil
    import subprocess
    import tempfile
    directory = tempfile.mkdtemp(prefix="raytrain-zygote-")  # 0700: only this user's raylet reaches it
    socket_path = os.path.join(directory, "zygote.sock")
    trampoline = python_for_raylet(directory, socket_path)
    try:  # with no zygote listening yet, it just runs the interpreter: this tests only that it can run
        subprocess.run([trampoline, "-c", "pass"], check=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(directory, ignore_errors=True)
        log(f"workers start without a zygote: cannot run {trampoline} ({e}); is {tempfile.gettempdir()} mounted "
            "noexec? Set TMPDIR to a directory where programs can run, or pass --no-zygote to silence this")
        return None
    return NodeZygote(directory, trampoline, socket_path, env)


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m runtime.cluster.zygote", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sv = sub.add_parser("serve", help="Import ray and torch, then fork Ray workers for the trampoline.")
    sv.add_argument("--socket", required=True, help="Unix socket path to listen on (bound once the imports are done).")
    ry = sub.add_parser("ray", help="Run the `ray` CLI with the raylet's workers started through TRAMPOLINE.")
    ry.add_argument("trampoline")
    ry.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.socket)
    return ray_main(args.trampoline, args.args[1:] if args.args[:1] == ["--"] else args.args)


if __name__ == "__main__":
    sys.exit(main())

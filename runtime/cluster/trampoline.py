"""The raylet's "python" on a node with a zygote (runtime/cluster/zygote.py): hands a plain worker start to
the zygote, which forks it; anything else runs as the raylet asked, by exec'ing the real interpreter.

Stdlib only, and nothing else imported: it runs under `python -IS` for every Python process the
raylet starts (workers and the raylet's agents).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

# The words of the zygote's line protocol (runtime/cluster/zygote.py answers, fork_from_zygote asks),
# named once for both ends. The request: an 8-byte length, JSON {argv, env, cwd}, and three descriptors
# (the worker's stdio). The zygote answers, one line each:
#     pid <n>          it forked the worker
#     exit <status> <t> the worker ended (negative: the signal that killed it), reaped at unix time t
#     refused <why>    it will not fork (a thread is running): start the worker plainly
PID, EXIT, REFUSED = "pid", "exit", "refused"


def protocol_line(word: str, rest: object = "") -> bytes:
    """One protocol line, as the zygote sends it."""
    return (f"{word} {rest}".rstrip() + "\n").encode()


def _word(raw: bytes) -> tuple[str, str]:
    """A protocol line as (word, rest)."""
    word, _, rest = raw.decode(errors="replace").strip().partition(" ")
    return word, rest


WAIT_FOR_ZYGOTE_S = 30  # a worker waits this long for a zygote still importing, then starts plainly (Ray allows 60 s)


def _cd_prefix(prefix) -> str | None:
    """The directory of a `cd DIR &&` command prefix, the one Ray's working_dir plugin adds
    (`["cd", shlex.quote(dir), "&&"]`); None for any other prefix."""
    if not (isinstance(prefix, list) and len(prefix) == 3 and prefix[0] == "cd" and prefix[2] == "&&"):
        return None
    import shlex
    try:
        parts = shlex.split(str(prefix[1]))
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 and os.path.isabs(parts[0]) else None


def _zygote_argv(argv: list[str], real_python: str, trampoline: str) -> tuple[list[str], dict, str | None] | None:
    """(default_worker argv, env vars to add, working directory or None) when `argv` (the trampoline's,
    after its own name) is a plain Python worker start that a fork can serve; None when it must run
    as the raylet asked. A job's working_dir arrives as a `cd DIR &&` prefix and PYTHONPATH in the
    context's env vars; the fork applies both (runtime/cluster/zygote.py).

    The raylet starts a worker without a runtime environment as `python default_worker.py ARGS`,
    and one with a runtime environment as `python setup_worker.py [-S] default_worker.py ARGS
    --serialized-runtime-env-context=... --language=PYTHON` (setup_worker applies the context, then
    execs `py_executable default_worker.py ARGS`)."""
    worker = os.path.join("workers", "default_worker.py")
    if argv and argv[0].endswith(worker):
        return argv, {}, None
    if len(argv) < 2 or not argv[0].endswith(os.path.join("workers", "setup_worker.py")):
        return None
    if not argv[1].endswith(worker):
        return None  # interpreter flags (-S, -s) between the two, or another entrypoint
    import argparse
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--serialized-runtime-env-context", default=None)
    parser.add_argument("--language", default=None)
    known, rest = parser.parse_known_args(argv[1:])
    if known.language != "PYTHON":
        return None
    try:
        ctx = json.loads(known.serialized_runtime_env_context or "{}")
    except ValueError:
        return None
    cwd = _cd_prefix(ctx["command_prefix"]) if ctx.get("command_prefix") else None
    if (ctx.get("command_prefix") and cwd is None) or ctx.get("override_worker_entrypoint") or ctx.get("java_jars"):
        return None
    if ctx.get("py_executable") not in (None, real_python, trampoline, sys.executable):
        return None
    env_vars = ctx.get("env_vars") or {}
    if not isinstance(env_vars, dict):
        return None
    return rest, {str(k): str(v) for k, v in env_vars.items()}, cwd


def fork_from_zygote(socket_path: str, argv: list[str], env: dict, cwd: str, fds=(0, 1, 2), on_pid=None,
                     forward_signals: bool = True, on_end=None) -> int | None:
    """Have the zygote at SOCKET_PATH fork `python ARGV` with ENV in CWD, on FDS as its stdio; wait for it.
    Its exit status (negative: the signal that killed it), or None when no zygote took it (none there,
    it refused because it found a thread, or it was not ready in time): start it plainly then. ON_PID
    gets the child's pid, ON_END the unix time the zygote reaped it (the moment it ended, not the later
    one this process heard of it); with FORWARD_SIGNALS (main thread only) signals to this process go to it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
    except OSError:
        conn.close()
        return None
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
    socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], list(fds))
    conn.settimeout(WAIT_FOR_ZYGOTE_S)  # it may still be importing
    reader = conn.makefile("rb")
    try:
        answer = reader.readline()
    except OSError:
        answer = b""
    word, rest = _word(answer)
    if word != PID:
        conn.close()  # first, so that the zygote sees the hang-up before it would fork for this request
        return None
    conn.settimeout(None)
    pid = int(rest)
    if on_pid is not None:
        on_pid(pid)
    if forward_signals:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            answer = reader.readline()
            break
        except InterruptedError:
            continue
    conn.close()
    word, rest = _word(answer)
    status, _, at = rest.partition(" ")
    if on_end is not None and word == EXIT and at:
        on_end(float(at))
    return int(status) if word == EXIT else -signal.SIGKILL


def trampoline_main(real_python: str, socket_path: str) -> None:
    """The raylet's worker command runs this; see runtime/cluster/zygote.py's docstring."""
    me, argv = sys.argv[0], sys.argv[1:]
    plan = _zygote_argv(argv, real_python, me)
    status = None
    if plan is not None:
        worker_argv, env_vars, cwd = plan
        env = dict(os.environ)
        env.update(env_vars)  # what setup_worker.py's RuntimeEnvContext.exec_worker does before its exec
        status = fork_from_zygote(socket_path, worker_argv, env, cwd or os.getcwd())
    if status is None:
        os.execv(real_python, [real_python, *argv])
    if status < 0:  # killed by a signal: die the same way, as the worker would have
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)


def python_for_raylet(directory: str, socket_path: str, real_python: str = sys.executable) -> str:
    """Write the trampoline into `directory` (an executable named `python`) and return its path."""
    import runtime
    runtime_parent = os.path.dirname(os.path.dirname(os.path.abspath(runtime.__file__)))  # where `runtime` is found
    path = os.path.join(directory, "python")
    text = (f"#!{real_python} -IS\n"
            "# written by runtime.cluster.trampoline: the raylet starts Python workers through this\n"
            "import sys\n"
            f"sys.path.insert(0, {runtime_parent!r})\n"
            "from runtime.cluster.trampoline import trampoline_main\n"
            f"trampoline_main({real_python!r}, {socket_path!r})\n")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path

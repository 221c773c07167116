"""A cluster that stays up, and drivers that come to it with their own code.

    python -m runtime launch --serve            # every node, as deploy starts it; the head holds, no driver
    python -m runtime run --code-dir DIR -- python train.py ...   # on the head, once per change

The head's launcher forms the cluster as for a deploy (barrier and all), then `hold`s: it listens
on a Unix socket on the head (`socket_path`, mode 0600: only the job's user can connect, the same
rule as the zygote's) until SIGTERM (`invoke down`, the scheduler's time limit), and publishes exit
code 0 then, so the workers leave at once. `run`, started on the head (`docker exec`, `srun
--overlap`), hands its stdio and the request to the head: the driver gets the head's own
environment (the job's Ray token included, which never leaves the launcher's memory) and the
client gets the driver's pid and then its exit code.

The driver runs in DIR (the project's code as `invoke run` sent it), with Ray's own job-level
runtime environment: `working_dir` DIR is given to the driver the way Ray's job supervisor gives it
(the job config in RAY_JOB_CONFIG_JSON_ENV_VAR), so the driver's `ray.init` uploads DIR to the GCS
once, content-addressed (gcs://_ray_pkg_<hash>.zip), and every node's runtime-env agent fetches it
once and starts this job's workers in it. Workers are new processes of this job (forked from the
node's zygote with the working directory applied, runtime/cluster/trampoline.py): no module of an earlier
run survives in them. A held cluster starts no warm hosts, since they would hold the image's code.
A `python script.py` or `python -m module` driver is forked from the head's zygote as well (its
imports done), so a run's first step comes without a torch import on the way.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from runtime import contract as C
from runtime.cluster import code_unpack, lifeline, log_relay, preload, trampoline
from runtime.errors import InputError, RaytrainError

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants: what the job supervisor sets
ZYGOTE_ENV = C.ZYGOTE_ENV  # the head's zygote, which forks drivers as it forks workers (launch sets it)


MAX_REQUEST = 1 << 20

# The words of the line protocol between a head (_serve) and a client (`run`, `request_stop`), named once
# for both ends. The client sends one JSON request: a run's, with its stdio as three descriptors, or
# {STOP: true}. The head answers, one line each:
#     pid <n>          the driver started (signals to the client go to it)
#     exit <status>    the driver ended (negative: the signal that ended it)
#     error <message>  the run was refused, in words for the user
#     stopping         the stop request was accepted
PID, EXIT, ERROR, STOPPING = "pid", "exit", "error", "stopping"
STOP = "stop"  # the stop request's key
RUN_ENV_PREFIX = "RAYTRAIN_"  # what a run passes on from its own environment (its run id, say); nothing else


def socket_path(env: dict) -> Path:
    """Where the head serves drivers: per job name (several jobs can share a host)."""
    name = env.get(C.JOB_NAME) or "job"
    if not re.fullmatch(C.JOB_NAME_RE, name):
        raise InputError(f"{C.JOB_NAME}={name[:80]!r}: a job name is lower-case letters, digits and '-' "
                         "(a DNS label of at most 40); the deploy artifacts set it from deploy.name")
    return Path(tempfile.gettempdir()) / f"raytrain-serving-{name}.sock"


def hold(address: str, ip: str, log: Callable[[str], None], env: dict) -> int:
    """Serve drivers until a stop request (`python -m runtime stop`), SIGTERM or SIGINT; 0 then (a held
    cluster that is taken down has done its job). ENV is what a driver of the head gets
    (runtime.cluster.launch.ray_env, the token included)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    path = socket_path(env)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))  # created 0600: only this user's `run` connects
    finally:
        os.umask(old)
    listener.listen(8)
    listener.settimeout(0.5)
    log(f"{C.SERVING_LINE} at {address} ({ip}); send drivers with `python -m runtime run` "
        "(invoke run); `python -m runtime stop` or SIGTERM (invoke down) ends it")
    try:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (socket.timeout, InterruptedError):
                continue
            threading.Thread(target=_serve, args=(conn, env, address, stop), daemon=True).start()
    finally:
        listener.close()
        path.unlink(missing_ok=True)
    log("serving: stopped; the nodes leave")
    return 0


def without_image_code(pythonpath: str) -> str:
    """PYTHONPATH without the image's project directory: a run's code is only what it was sent, so a
    module deleted since the image was built cannot be imported from the image's copy."""
    image_code = os.path.realpath(C.PROJECT_DIR)
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p and os.path.realpath(p) != image_code)


# Ray's driver folds a line that several workers print alike into the first one and a "[repeated Nx
# across cluster]" note: a run made to see what its change does on each rank would see rank 0's line only
DEDUP_ENV = "RAY_DEDUP_LOGS"


def driver_env(code_dir: Path, env: dict, address: str) -> dict:
    """The driver's environment: the head's, with the cluster's address, DIR as the job's working_dir,
    the image's project directory off PYTHONPATH (the raylets of a held cluster run without it), and
    every worker's lines shown as they come (DEDUP_ENV off, unless the head's environment sets it)."""
    job = json.loads(env.get(JOB_CONFIG_ENV) or "{}")
    if job.get("runtime_env", {}).get("working_dir"):
        raise InputError(f"{JOB_CONFIG_ENV} already names a working_dir; `run` sets it to the code it was sent")
    job.setdefault("runtime_env", {})["working_dir"] = str(code_dir)
    return {DEDUP_ENV: "0", **env, "PYTHONPATH": without_image_code(env.get("PYTHONPATH", "")),
            "RAY_ADDRESS": address, JOB_CONFIG_ENV: json.dumps(job)}


def _serve(conn: socket.socket, env: dict, address: str, stop: threading.Event) -> None:
    """One run: the request and the client's stdio in, `pid N` and `exit S` (or `error ...`) out.
    A stop request: `stopping` out, and the head stops serving."""
    fds: list[int] = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        req = json.loads(msg)
        if req.get(STOP) is True:
            stop.set()
            _say(conn, STOPPING)
            return
        if len(fds) != 3:
            raise InputError("a run hands over its stdin, stdout and stderr")
        code_dir, cmd = Path(req["code_dir"]), [str(a) for a in req["cmd"]]
        extra = {k: str(v) for k, v in req.get("env", {}).items() if str(k).startswith(RUN_ENV_PREFIX)
                 and k != ZYGOTE_ENV}
        if not cmd or not code_dir.is_dir():
            raise InputError(f"--code-dir {code_dir}: not a directory on the head, or no command")
        status = _start_driver(code_dir, cmd, driver_env(code_dir, {**env, **extra}, address), fds,
                               lambda pid: _say(conn, PID, pid))
        _say(conn, EXIT, status)
    except Exception as e:  # noqa: BLE001 - said to the client, whose run fails with it
        try:
            _say(conn, ERROR, " ".join(str(e).split())[:2000])
        except OSError:
            pass
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def _say(conn: socket.socket, word: str, rest: object = "") -> None:
    """The head's side: one protocol line to the client."""
    conn.sendall((f"{word} {rest}".rstrip() + "\n").encode())


def _start_driver(code_dir: Path, cmd: list[str], env: dict, fds: list[int], on_pid) -> int:
    """The driver on the client's stdin, its output through the log relay to the client's stdout and
    stderr; forked from the head's zygote when it is `python script.py`, else a new process. Its
    exit status (negative: the signal that ended it)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    relayed = log_relay.relay_fds(out_r, err_r, os.fdopen(os.dup(fds[1]), "wb"), os.fdopen(os.dup(fds[2]), "wb"))
    try:
        target = preload.target_of(cmd)
        zygote = env.get(ZYGOTE_ENV)
        if zygote and target is not None:
            if target.script is not None:
                first = [target.script if os.path.isabs(target.script) else str(code_dir / target.script)]
            else:
                first = ["-m", target.module]
            status = trampoline.fork_from_zygote(zygote, [*first, *target.args], env, str(code_dir),
                                                 fds=(fds[0], out_w, err_w), on_pid=on_pid, forward_signals=False)
            if status is not None:
                return status
        proc = subprocess.Popen(cmd, cwd=code_dir, env=env, stdin=fds[0], stdout=out_w, stderr=err_w,
                                preexec_fn=lifeline.tied_to_me())  # it dies with the head's launcher
        on_pid(proc.pid)
        return proc.wait()
    finally:
        os.close(out_w)  # the driver holds its own copies: the relay ends when it closes them
        os.close(err_w)
        log_relay.finish(relayed)


def _connect(env: dict) -> socket.socket:
    path = socket_path(env)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError as e:
        conn.close()
        raise RaytrainError(f"no cluster is serving on this node ({path}: {e.strerror}): start one with "
                            "`invoke up` (launch --serve), or run this on its head") from None
    return conn


def request_stop(env: dict | None = None) -> int:
    """Tell the head serving on this node to stop (invoke down): it stops serving, publishes exit code 0,
    and every node leaves in order, without a signal to any process of the job. 0 once it said so."""
    conn = _connect(dict(os.environ if env is None else env))
    with conn:
        conn.sendall(json.dumps({STOP: True}).encode())
        answer = conn.makefile("rb").readline().decode(errors="replace").strip()
    if answer != STOPPING:
        raise RaytrainError(f"the head did not accept the stop request ({answer or 'no answer'})")
    return 0


def run(code_dir: Path, cmd: list[str], env: dict | None = None, unpack_root: Path | None = None) -> int:
    """Run CMD as a driver on the cluster this head holds, in CODE_DIR; its exit code (128+N for a signal).
    With UNPACK_ROOT the code comes as a tar on stdin first (runtime/cluster/code_unpack.py) and the driver's stdin is
    /dev/null. Signals this process gets (Ctrl-C, scancel of the step) go to the driver."""
    env = dict(os.environ if env is None else env)
    if not cmd:
        raise InputError("no driver command: python -m runtime run --code-dir DIR -- python train.py ...")
    if unpack_root is not None:
        code_unpack.unpack(unpack_root, code_dir, sys.stdin.buffer)
    if not code_dir.is_dir():
        raise InputError(f"--code-dir {code_dir}: not a directory; `invoke run` unpacks the project's code there")
    conn = _connect(env)
    request = {"code_dir": str(code_dir.resolve()), "cmd": cmd,
               "env": {k: v for k, v in env.items() if k.startswith(RUN_ENV_PREFIX)}}
    stdin = os.open(os.devnull, os.O_RDONLY) if unpack_root is not None else 0  # stdin was the code
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], [stdin, 1, 2])
    finally:
        if stdin:
            os.close(stdin)
    reader = conn.makefile("rb")
    pid = None
    for raw in reader:
        kind, _, rest = raw.decode(errors="replace").strip().partition(" ")
        if kind == PID:
            pid = int(rest)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda s, _f: os.kill(pid, s))
        elif kind == EXIT:
            code = int(rest)
            return 128 - code if code < 0 else code
        elif kind == ERROR:
            raise RaytrainError(f"the head refused the run: {rest}")
    raise RaytrainError("the head closed the connection before the driver's exit code (the cluster is stopping?)")

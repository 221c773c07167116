"""A cluster that stays up, and drivers that come to it with their own code.

    python -m runtime launch --serve            # every node, as deploy starts it; the head holds, no driver
    python -m runtime run --code-dir DIR -- python train.py ...   # on the head, once per change

The head's launcher forms the cluster as for a deploy (barrier and all), then `hold`s: it writes
where its GCS is to a file on the head (`info_path`) and waits for SIGTERM (`invoke down`, the
scheduler's time limit). It publishes exit code 0 then, so the workers leave at once.

`run` starts a driver there in DIR (the project's code as `invoke run` sent it), with Ray's own
job-level runtime environment: `working_dir` DIR is given to the driver the way Ray's job supervisor
gives it (the job config in RAY_JOB_CONFIG_JSON_ENV_VAR), so the driver's `ray.init` uploads DIR to
the GCS once, content-addressed (gcs://_ray_pkg_<hash>.zip), and every node's runtime-env agent
fetches it once and starts this job's workers in it. Workers are new processes of this job (forked
from the node's zygote with the working directory applied, runtime/trampoline.py): no module of an
earlier run survives in them. A held cluster starts no warm hosts, since they would hold the
image's code. A `python script.py` driver is forked from the head's zygote as well (its imports
done), so a run's first step comes without a torch import on the way.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from runtime import contract as C
from runtime import lifeline, log_relay, preload, trampoline
from runtime.errors import InputError, RaytrainError

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants: what the job supervisor sets
ZYGOTE_ENV = "RAYTRAIN_ZYGOTE_SOCKET"  # the head's zygote, which forks drivers as it forks workers (launch sets it)


def info_path(env: dict) -> Path:
    """Where the head says it is serving: per job name (several jobs can share a host)."""
    return Path(tempfile.gettempdir()) / f"raytrain-serving-{env.get(C.JOB_NAME) or 'job'}.json"


def _ray_settings(env: dict) -> dict:
    """The Ray settings the head's drivers get (auth mode, health checks, log colours); never the token,
    which a driver takes from its own environment."""
    return {k: v for k, v in env.items() if k.startswith("RAY_") and k not in (C.AUTH_TOKEN, "RAY_ADDRESS")}


def hold(address: str, ip: str, log: Callable[[str], None], env: dict) -> int:
    """Serve until SIGTERM or SIGINT; 0 then (a held cluster that is taken down has done its job).
    ENV is what a driver of the head would get (runtime.launch.ray_env)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    path = info_path(env)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"address": address, "node_ip": ip, "pid": os.getpid(), "since": time.time(),
                   "ray_env": _ray_settings(env), "zygote": env.get(ZYGOTE_ENV)}, f)
    os.replace(tmp, path)
    log(f"serving: the cluster is up at {address}; send drivers with `python -m runtime run` (invoke run); "
        "SIGTERM (invoke down) ends it")
    try:
        while not stop.wait(1.0):
            pass
    finally:
        path.unlink(missing_ok=True)
    log("serving: stopped; the nodes leave")
    return 0


def read_info(env: dict) -> dict:
    path = info_path(env)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RaytrainError(f"no cluster is serving on this node ({path} is missing): start one with "
                            "`invoke up` (launch --serve), or run this on its head") from None
    except (OSError, ValueError) as e:
        raise RaytrainError(f"{path}: cannot read the serving head's address ({e}); restart the cluster") from None


def without_image_code(pythonpath: str) -> str:
    """PYTHONPATH without the image's project directory: a run's code is only what it was sent, so a
    module deleted since the image was built cannot be imported from the image's copy."""
    image_code = os.path.realpath(C.PROJECT_DIR)
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p and os.path.realpath(p) != image_code)


def driver_env(code_dir: Path, env: dict, info: dict) -> dict:
    """The driver's environment: the held cluster's address and Ray settings, DIR as the job's working_dir,
    the image's project directory off PYTHONPATH (the raylets of a held cluster run without it: launch)."""
    job = json.loads(env.get(JOB_CONFIG_ENV) or "{}")
    if job.get("runtime_env", {}).get("working_dir"):
        raise InputError(f"{JOB_CONFIG_ENV} already names a working_dir; `run` sets it to the code it was sent")
    job.setdefault("runtime_env", {})["working_dir"] = str(code_dir)
    return {**env, **info.get("ray_env", {}), "PYTHONPATH": without_image_code(env.get("PYTHONPATH", "")),
            "RAY_ADDRESS": info["address"], JOB_CONFIG_ENV: json.dumps(job)}


def run(code_dir: Path, cmd: list[str], env: dict | None = None) -> int:
    """Run CMD as a driver on the held cluster, in CODE_DIR; its exit code (128+N for a signal)."""
    env = dict(os.environ if env is None else env)
    if not cmd:
        raise InputError("no driver command: python -m runtime run --code-dir DIR -- python train.py ...")
    if not code_dir.is_dir():
        raise InputError(f"--code-dir {code_dir}: not a directory; `invoke run` unpacks the project's code there")
    info = read_info(env)
    denv = driver_env(code_dir, env, info)
    code = _forked(code_dir, cmd, denv, info.get("zygote"))
    if code is None:
        proc = subprocess.Popen(cmd, cwd=code_dir, env=denv, preexec_fn=lifeline.tied_to_me(), **log_relay.streams())
        relayed = log_relay.relay(proc)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: proc.send_signal(s))
        code = proc.wait()
        log_relay.finish(relayed)
    return 128 - code if code < 0 else code


def _forked(code_dir: Path, cmd: list[str], env: dict, socket_path: str | None) -> int | None:
    """A `python script.py ...` driver forked from the head's zygote (torch already imported: the
    first step comes seconds sooner), its output through the log relay; None when it cannot be
    (another command form, no zygote, the zygote refused): then it starts as a new process."""
    target = preload.target_of(cmd)
    if socket_path is None or target is None or target.script is None:
        return None
    script = str(code_dir / target.script) if not os.path.isabs(target.script) else target.script
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    relayed = log_relay.relay_fds(out_r, err_r)
    try:
        return trampoline.fork_from_zygote(socket_path, [script, *target.args], env, str(code_dir),
                                           fds=(0, out_w, err_w))
    finally:
        os.close(out_w)  # the child holds its own copies: the relay ends when the child's close
        os.close(err_w)
        log_relay.finish(relayed)

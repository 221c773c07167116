"""`python -m runtime launch -- CMD...`: run on every node; forms the Ray cluster, runs CMD on the head.

Head: `ray start --head` on pinned ports, a readiness barrier until every expected node is alive
(deadline, names the missing nodes, fails fast when a node dies), then the driver; its exit code is
published in Ray's KV store and becomes every node's exit code. Workers: poll the head's GCS port
until it answers (no fixed sleeps), join, and leave when the head finishes or dies (within seconds:
the raylet's GCS reconnect timeout is lowered from Ray's 60 s).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from runtime import contract as C
from runtime import preload, zygote
from runtime.contract import DEFAULT_PORT_BASE
from runtime.errors import RaytrainError
from runtime.identity import NodeIdentity, detect
from runtime.ports import RayPorts
from runtime.spec import load_spec
from runtime.wait import WaitTimeout, wait_until

EXIT_KEY = b"raytrain:driver_exit"
GCS_RECONNECT_S = 5


class LaunchError(RaytrainError):
    """The node could not start or join the job; the message says what to check."""


def log(ident: Optional[NodeIdentity], msg: str) -> None:
    tag = f"[launch node{ident.node_rank}/{ident.num_nodes} {ident.hostname}]" if ident else "[launch]"
    print(f"{tag} {msg}", file=sys.stderr, flush=True)


@dataclass
class LaunchOptions:
    port_base: int = DEFAULT_PORT_BASE
    port_stride: int = 0          # >0 when several nodes share one host: node k uses base + k*stride
    barrier_timeout_s: float = 300
    join_timeout_s: float = 300
    auth: str = "token"           # token | disabled
    num_cpus: Optional[int] = None
    num_gpus: Optional[int] = None
    node_ip: Optional[str] = None
    warm_hosts: Optional[int] = None  # worker hosts started per node while the barrier waits (None: 1, or the GPUs)
    preload_driver: bool = True   # start a Python driver during the barrier with its imports done (runtime.preload)
    zygote: bool = True           # fork the raylet's Python workers from a process with torch imported (runtime.zygote)


def routable_ip(ident: NodeIdentity, override: Optional[str] = None) -> str:
    """The address other nodes reach this one at: the route towards the head, not 127.0.0.1."""
    if override:
        return override
    head = ident.head_address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(head), 9))
            ip = s.getsockname()[0]
        if not ip.startswith("127.") or ident.num_nodes == 1:
            return ip
    except OSError:
        pass
    return socket.gethostbyname(socket.gethostname())


def ray_env(opts: LaunchOptions) -> dict:
    env = dict(os.environ)
    env["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(GCS_RECONNECT_S)
    # declare a lost node dead after ~5 s instead of Ray's default, so its placement groups move sooner
    env.setdefault("RAY_health_check_period_ms", "1000")
    env.setdefault("RAY_health_check_failure_threshold", "5")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if opts.auth == "disabled":
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop(C.AUTH_TOKEN, None)
    else:
        if not env.get(C.AUTH_TOKEN):
            raise LaunchError(f"{C.AUTH_TOKEN} is not set: every node of the job needs the same token at run time "
                              "(the deploy artifacts generate one per job), or pass --no-auth to run without authentication")
        env["RAY_AUTH_MODE"] = "token"
    return env


def check_shm(ident: NodeIdentity) -> None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return
    shm = st.f_frsize * st.f_blocks
    if shm < 2 * 2**30:
        log(ident, f"WARNING: /dev/shm is {shm / 2**20:.0f} MiB; Ray's object store falls back to slow disk. "
                   "Give the container more (docker --shm-size=8g, a Kubernetes emptyDir with medium: Memory at /dev/shm)")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _start_args(opts: LaunchOptions, ident: NodeIdentity, ip: str) -> list[str]:
    args = [f"--node-ip-address={ip}", "--disable-usage-stats"]
    if opts.num_cpus is not None:
        args.append(f"--num-cpus={opts.num_cpus}")
    gpus = opts.num_gpus if opts.num_gpus is not None else (ident.gpus_per_node or None)
    if gpus is not None:
        args.append(f"--num-gpus={gpus}")
    return args


def barrier(ident: NodeIdentity, address: str, timeout_s: float,
            on_alive: Optional[Callable[[list], None]] = None) -> float:
    """Block until every expected node is alive; return the time the last one registered.
    on_alive(nodes) is called with the alive nodes at every poll."""
    import ray
    alive: list = []

    def all_alive() -> Optional[float]:
        nodes = ray.nodes()
        alive[:] = [n for n in nodes if n["Alive"]]
        if on_alive:
            on_alive(alive)
        dead = [n for n in nodes if not n["Alive"]]
        if dead:
            names = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeManagerHostname']})" for n in dead)
            raise LaunchError(f"node(s) {names} joined and then died before all {ident.num_nodes} nodes were up")
        return time.monotonic() if len(alive) >= ident.num_nodes else None

    def too_late() -> LaunchError:
        joined = sorted(n["NodeManagerAddress"] for n in alive)
        missing = [a for a in ident.node_addresses if a not in joined] if ident.node_addresses else []
        detail = f"missing: {', '.join(missing)}" if missing else f"{ident.num_nodes - len(alive)} node(s) missing"
        return LaunchError(f"only {len(alive)}/{ident.num_nodes} nodes joined within {timeout_s:.0f}s "
                           f"(joined: {', '.join(joined)}; {detail}); check the workers' logs and that they reach "
                           f"{address}")
    return wait_until(all_alive, timeout_s=timeout_s, interval_s=0.1, what="every node", on_timeout=too_late)


def warmer(ident: NodeIdentity, per_node: int) -> Callable[[list], None]:
    """Starts `per_node` worker hosts on each node as it joins (a Ray worker process that imports
    torch), so the driver's first worker group finds them ready (runtime.spares.warm_up)."""
    started: set = set()
    hosts: list = []  # held for the whole job: a host lives while its creator holds its handle

    def on_alive(nodes: list) -> None:
        for n in nodes:
            if per_node > 0 and n["NodeID"] not in started:
                started.add(n["NodeID"])
                try:
                    from runtime.spares import warm_up
                    hosts.extend(warm_up(n["NodeID"], per_node))
                except Exception as e:  # an optimisation only: the group starts its own hosts
                    log(ident, f"could not warm up worker hosts on {n['NodeManagerAddress']}: {e}")
    return on_alive


def ports_for(ident: NodeIdentity, opts: LaunchOptions) -> RayPorts:
    return RayPorts(opts.port_base, ident.node_rank * opts.port_stride)


def temp_dir_args(ports: RayPorts, opts: LaunchOptions) -> list[str]:
    """Nodes sharing a host would share Ray's session directory, where two raylets starting at
    once can pick the same socket file; several nodes per host each get a temp dir named by port."""
    if not opts.port_stride:
        return []
    return [f"--temp-dir={Path(tempfile.gettempdir()) / f'raytrain-{ports.node_base}'}"]


def ray_cli() -> str:
    """The `ray` script installed beside this interpreter (the image's venv), else the one on PATH.

    Never PATH first: a login shell (enroot's default) may have reset PATH to the distribution's.
    """
    beside = Path(sys.executable).parent / "ray"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise LaunchError(f"no `ray` command beside {sys.executable} or on PATH; run inside the image or "
                          "install the runtime's requirements into this interpreter's environment")
    return found


def _start_node(ray_cmd: list[str], args: list[str], env: dict) -> subprocess.Popen:
    """`ray start --block` as our child: stopping it stops exactly this node's Ray processes,
    so several nodes can share one host (no `ray stop`, which would kill them all).
    `ray_cmd` is `[ray]`, or the zygote's stand-in for it (runtime.zygote).
    Its output goes to a file (a pipe nobody reads would block it); _tail() reads it back."""
    out = tempfile.NamedTemporaryFile(prefix="ray-start-", suffix=".log", delete=False)
    proc = subprocess.Popen([*ray_cmd, "start", "--block", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = out.name  # type: ignore[attr-defined]
    out.close()
    return proc


def _tail(proc: subprocess.Popen, lines: int = 15) -> str:
    try:
        with open(proc.log_path) as f:  # type: ignore[attr-defined]
            return "\n    ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ""


def _stop_node(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        os.unlink(proc.log_path)  # type: ignore[attr-defined]
    except OSError:
        pass


def _wait_started(proc: subprocess.Popen, host: str, port: int, timeout_s: float, what: str) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise LaunchError(f"{what} exited with {proc.returncode}:\n    {_tail(proc)}")
        return port_open(host, port)
    wait_until(up, timeout_s=timeout_s, interval_s=0.1, what=f"{what} to open {host}:{port}",
               hint="the node's Ray did not come up", logs=lambda: _tail(proc))


def run_head(ident: NodeIdentity, opts: LaunchOptions, cmd: list[str], env: dict, ip: str, ray_cmd: list[str]) -> int:
    ports = ports_for(ident, opts)
    address = f"{ip}:{ports.gcs}"
    t0 = time.monotonic()
    node = _start_node(ray_cmd, ["--head", "--include-dashboard=false", *ports.head_args(), *temp_dir_args(ports, opts),
                        *_start_args(opts, ident, ip)], env)
    try:
        _wait_started(node, ip, ports.gcs, 120, "ray start --head")
        driver_env = {**env, "RAY_ADDRESS": address}
        target = preload.target_of(cmd) if opts.preload_driver else None
        early = (subprocess.Popen(preload.preload_argv(target), env=driver_env, stdin=subprocess.PIPE)
                 if target else None)
        import ray
        try:
            # log_to_driver: the warm hosts belong to this process's job, and their output (once a group
            # adopts them, the ranks') is printed here, on the head's output, as the driver's own workers' is
            ray.init(address=address, log_to_driver=True, logging_level="ERROR")
            per_node = opts.warm_hosts if opts.warm_hosts is not None else (ident.gpus_per_node or 1)
            warm = warmer(ident, per_node)  # held until the driver exits: it holds the warm hosts' handles
            last = barrier(ident, address, opts.barrier_timeout_s, warm)
        except BaseException:
            if early:
                early.kill()
                early.wait()
            raise
        log(ident, f"barrier passed: {ident.num_nodes} node(s) alive {time.monotonic() - t0:.2f}s after head start; "
                   f"driver starts {1000 * (time.monotonic() - last):.0f} ms after the last node registered "
                   f"(at {time.time():.3f}{', imports preloaded' if early else ''})")
        proc = go(early) if early else subprocess.Popen(cmd, env=driver_env)
        forward = lambda sig, _f: proc.send_signal(sig)  # noqa: E731
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = proc.wait()
        log(ident, f"driver exited with {code}")
        from ray.experimental import internal_kv
        internal_kv._internal_kv_put(EXIT_KEY, str(code).encode(), overwrite=True)
        _wait_workers_left(ident, deadline=time.monotonic() + 2 * GCS_RECONNECT_S)
        return code
    finally:
        _disconnect()
        _stop_node(node)


def go(early: subprocess.Popen) -> subprocess.Popen:
    """Let the preloaded driver run the script (if it died while importing, its exit code stands)."""
    try:
        early.stdin.write(preload.GO)
        early.stdin.close()
    except BrokenPipeError:
        pass
    return early


def _disconnect() -> None:
    """Leave Ray before its GCS goes, or Ray's core worker ends this process with its own exit code."""
    if "ray" in sys.modules:
        import ray
        if ray.is_initialized():
            ray.shutdown()


def _wait_workers_left(ident: NodeIdentity, deadline: float) -> None:
    """Give workers a moment to read the exit code and leave cleanly before the head goes."""
    import ray
    try:
        wait_until(lambda: len([n for n in ray.nodes() if n["Alive"]]) <= 1, timeout_s=max(0.0, deadline - time.monotonic()),
                   what="the workers to leave")
    except WaitTimeout:
        pass  # they are stopped with the head


def run_worker(ident: NodeIdentity, opts: LaunchOptions, env: dict, ip: str, ray_cmd: list[str]) -> int:
    ports = ports_for(ident, opts)
    head = ident.head_address
    log(ident, f"waiting for the head at {head}:{ports.gcs}")
    wait_until(lambda: port_open(head, ports.gcs), timeout_s=opts.join_timeout_s, what=f"the head {head}:{ports.gcs}",
               hint="check that the head started and that this node reaches it (address, firewall)")
    node = _start_node(ray_cmd, [f"--address={head}:{ports.gcs}", *ports.node_args(), *temp_dir_args(ports, opts),
                        *_start_args(opts, ident, ip)], env)
    try:
        log(ident, "joining the cluster")
        # this node's raylet must be up before this process connects to Ray (it attaches to a local raylet)
        _wait_started(node, ip, ports.node_manager, opts.join_timeout_s, "ray start (worker)")
        return _follow_head(ident, node, f"{head}:{ports.gcs}")
    finally:
        _disconnect()
        _stop_node(node)


def _follow_head(ident: NodeIdentity, node: subprocess.Popen, address: str) -> int:
    """Stay until the head publishes the driver's exit code, or this node's Ray exits (head lost).

    The exit code is read from the GCS directly, not through a Ray driver: a driver attaches to
    "the" raylet of this node's IP, which is ambiguous when several nodes share an IP (several
    slurmd on one host) and unreachable when their /tmp is private (containers)."""
    from ray._raylet import GcsClient
    gcs = GcsClient(address=address)
    lost_since = None
    while True:
        if node.poll() is not None:
            log(ident, f"this node's Ray exited ({node.returncode}): the head is gone; leaving\n    {_tail(node, 5)}")
            return 1
        try:
            val = gcs.internal_kv_get(EXIT_KEY, None, timeout=2)
            lost_since = None
            if val is not None:
                code = int(val)
                log(ident, f"driver finished with {code}; leaving")
                return code
        except Exception:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > GCS_RECONNECT_S:
                log(ident, "lost the head; leaving")
                return 1
        time.sleep(0.3)


def launch(cmd: list[str], opts: LaunchOptions, env_in: Optional[dict] = None) -> int:
    env_in = dict(os.environ if env_in is None else env_in)
    spec = load_spec(env_in[C.SPEC_PATH]) if env_in.get(C.SPEC_PATH) else None
    ident = detect(env_in, spec)
    env = ray_env(opts)
    # Ray reads its auth settings when it is imported: this process must see them before `import ray`
    for key in ("RAY_AUTH_MODE", C.AUTH_TOKEN, "RAY_gcs_rpc_server_reconnect_timeout_s"):
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
    ip = routable_ip(ident, opts.node_ip)
    log(ident, f"identity from {ident.source}: node {ident.node_rank} of {ident.num_nodes}, head {ident.head_address}, "
               f"ip {ip}, gpus {ident.gpus_per_node}, node type {ident.node_type}")
    check_shm(ident)
    ray_cmd = [ray_cli()]  # fail before anything starts
    if ident.is_head and not cmd:
        raise LaunchError("no driver command given: python -m runtime launch -- python train.py ...")
    # the zygote imports torch while this node waits for the head and the barrier; the raylet forks
    # its Python workers from it (runtime/zygote.py)
    zyg = zygote.start(env, lambda msg: log(ident, msg)) if opts.zygote else None
    try:
        if zyg:
            ray_cmd = zyg.ray_argv()
        if ident.is_head:
            return run_head(ident, opts, cmd, env, ip, ray_cmd)
        return run_worker(ident, opts, env, ip, ray_cmd)
    finally:
        if zyg:
            zyg.stop()

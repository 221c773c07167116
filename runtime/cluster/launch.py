"""`python -m runtime launch -- CMD...`: run on every node; forms the Ray cluster, runs CMD on the head.

Head: `ray start --head` on pinned ports, a readiness barrier until every expected node is alive
(deadline, names the missing nodes, fails within seconds when a node dies or a worker reports that
it gave up), then the driver; its exit code is the head's exit code on every path, and is published
in Ray's KV store for the workers. Workers: poll the head's GCS port until it answers (no fixed
sleeps), join, and leave with the driver's code when the head publishes it, or with EXIT_HEAD_LOST
when the head is gone first (within seconds: a worker's Ray has its GCS reconnect timeout lowered
from Ray's 60 s). On every node a Ray start that fails is tried again until the join timeout
(runtime/cluster/ray_node.py); a worker tells the head of each retry and of giving up
(runtime/cluster/node_records.py).

This process never loads Ray: the barrier, the warm hosts and the exit code's publication run in a
child (runtime/cluster/ray_agent.py), since Ray ends a process whose GCS stops answering with its own code.
Every process it starts (the node's `ray start`, the zygote, the agent) dies with it, SIGKILL
included (runtime/cluster/lifeline.py).

Exit codes: the driver's (head); the driver's as published (workers); 2 the node could not start
or join (the message says why); 3 (EXIT_HEAD_LOST) a worker lost the head before it published the
driver's code; 4 (EXIT_NODE_LOST) a worker's own Ray died after it joined.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from runtime import contract as C
from runtime.cluster import lifeline, log_relay, node_records, preload, ray_node, ray_train_defaults, serving, zygote
from runtime.cluster.agent_client import BARRIER, EXIT, LOST, PUBLISHED, RayAgent
from runtime.cluster.node_log import LaunchError, log
from runtime.contract import DEFAULT_PORT_BASE, EXIT_HEAD_LOST, EXIT_NODE_LOST
from runtime.cluster.identity import NodeIdentity, detect
from runtime.contract import RayPorts
from runtime.spec import load_spec
from runtime.wait import wait_until

GCS_RECONNECT_S = 5


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
    preload_driver: bool = True   # start a Python driver during the barrier with its imports done (runtime.cluster.preload)
    zygote: bool = True           # fork the raylet's Python workers from a process with torch imported (runtime.cluster.zygote)
    serve: bool = False           # head: no driver; hold the formed cluster for `python -m runtime run` (runtime.cluster.serving)


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
    # declare a lost node dead after ~5 s instead of Ray's default, so its placement groups move sooner
    env.setdefault("RAY_health_check_period_ms", "1000")
    env.setdefault("RAY_health_check_failure_threshold", "5")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the job's own lines, not Ray's: no INFO lines from ray.init ("Connecting to existing Ray cluster at
    # ..."), and every rank's line shown, never folded into "[repeated Nx across cluster]" (a user who wants
    # Ray's sets RAY_LOGGER_LEVEL=info or RAY_DEDUP_LOGS=1)
    env.setdefault("RAY_LOGGER_LEVEL", "warning")
    env.setdefault("RAY_DEDUP_LOGS", "0")
    # the images carry Ray's minimal install, with no metrics agent: without this every node logs
    # "Failed to establish connection to the event+metrics exporter agent" (set it to 1 with ray[default]);
    # Ray still says it now and then, and the relay drops it while this is 0 (log_relay.dropped)
    env.setdefault(log_relay.METRICS_ENV, log_relay.METRICS_DEFAULT)
    if not sys.stdout.isatty():  # a log file or a scheduler's pipe: Ray's "(pid=...)" prefixes without ANSI colours
        env.setdefault("RAY_COLOR_PREFIX", "0")
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
    # the node's rank as a resource: a driver finds the job's node k by it (runtime/workers/script_ranks.py)
    args = [f"--node-ip-address={ip}", "--disable-usage-stats",
            f"--resources={json.dumps({f'{C.NODE_RESOURCE_PREFIX}{ident.node_rank}': 1})}"]
    if opts.num_cpus is not None:
        args.append(f"--num-cpus={opts.num_cpus}")
    gpus = opts.num_gpus if opts.num_gpus is not None else (ident.gpus_per_node or None)
    if gpus is not None:
        args.append(f"--num-gpus={gpus}")
    return args


def _gate(opts: LaunchOptions) -> Optional[ray_node.HostGate]:
    """Nodes that share a host (a port stride) take turns starting Ray (ray_node.HostGate)."""
    return ray_node.HostGate.shared_host() if opts.port_stride else None


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


TERMINATING = threading.Event()  # set on SIGTERM: the node is being taken away, stop at once


def _stop(node: ray_node.RayNode) -> None:
    node.stop(terminating=TERMINATING.is_set())


def run_head(ident: NodeIdentity, opts: LaunchOptions, cmd: list[str], env: dict, ip: str, ray_cmd: list[str]) -> int:
    ports = ports_for(ident, opts)
    address = f"{ip}:{ports.gcs}"
    t0 = time.monotonic()
    node = _start(ident, ray_cmd, ["--head", "--include-dashboard=false", *ports.head_args(),
                                   *temp_dir_args(ports, opts), *_start_args(opts, ident, ip)], env,
                  timeout_s=opts.join_timeout_s, what="ray start --head", gate=_gate(opts))
    agent: Optional[RayAgent] = None
    try:
        driver_env = {**env, "RAY_ADDRESS": address}
        target = preload.target_of(cmd) if opts.preload_driver and not opts.serve else None
        early = (subprocess.Popen(preload.preload_argv(target), env=driver_env, stdin=subprocess.PIPE,
                                  preexec_fn=lifeline.tied_to_me(), **log_relay.streams()) if target else None)
        relayed = log_relay.relay(early) if early else []
        per_node = opts.warm_hosts if opts.warm_hosts is not None else (ident.gpus_per_node or 1)
        if opts.serve:
            per_node = 0  # a warm host carries the image's code; each `run` ships its own (runtime.cluster.serving)
        try:
            agent = RayAgent(address, driver_env, "head", "--identity", json.dumps(dataclasses.asdict(ident)),
                             "--barrier-timeout", str(opts.barrier_timeout_s), "--warm-hosts", str(per_node),
                             "--leave-timeout", str(2 * GCS_RECONNECT_S))
            since_last = float(agent.expect(BARRIER, node))
        except BaseException:
            if early:
                early.kill()
                early.wait()
            raise
        log(ident, f"barrier passed: {ident.num_nodes} node(s) alive {time.monotonic() - t0:.2f}s after head start; "
                   f"driver starts {1000 * since_last:.0f} ms after the last node registered"
                   f"{' (imports preloaded)' if early else ''}")
        if opts.serve:
            code = serving.hold(address, ip, lambda msg: log(ident, msg), driver_env)
            TERMINATING.set()  # the cluster is being taken down (invoke down): this node goes without the normal grace
            try:
                agent.send(EXIT, code)
                agent.expect(PUBLISHED, node, timeout_s=2 * GCS_RECONNECT_S + 30)
            except LaunchError:  # Slurm signals every process of the step, the agent too: the nodes got
                pass             # the same signal and leave with the same code
            return code
        proc = go(early) if early else subprocess.Popen(cmd, env=driver_env, preexec_fn=lifeline.tied_to_me(),
                                                        **log_relay.streams())
        relayed = relayed or log_relay.relay(proc)
        def forward(sig: int, _frame) -> None:
            if sig == signal.SIGTERM:
                TERMINATING.set()
            proc.send_signal(sig)
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = proc.wait()
        log_relay.finish(relayed)
        if code < 0:  # killed by a signal: the code a shell would give
            code = 128 - code
        log(ident, f"driver exited with {code}")
        try:
            agent.send(EXIT, code)
            agent.expect(PUBLISHED, node, timeout_s=2 * GCS_RECONNECT_S + 30)
        except LaunchError as e:  # the code stands; the workers leave when this node's Ray stops
            log(ident, f"could not tell the workers the driver's exit code ({e}); they leave when the head stops")
        return code
    finally:
        if agent:
            agent.stop(terminating=TERMINATING.is_set())
        _stop(node)


def _start(ident: NodeIdentity, ray_cmd: list[str], args: list[str], env: dict, *, timeout_s: float, what: str,
           gate: Optional[ray_node.HostGate], on_retry=None, stop_if=None) -> ray_node.RayNode:
    try:
        return ray_node.start(ray_cmd, args, env, timeout_s=timeout_s, what=what, say=lambda m: log(ident, m),
                              on_retry=on_retry, stop_if=stop_if, gate=gate)
    except ray_node.StartFailed as e:
        raise LaunchError(str(e)) from None


def go(early: subprocess.Popen) -> subprocess.Popen:
    """Let the preloaded driver run the script (if it died while importing, its exit code stands)."""
    try:
        early.stdin.write(preload.GO)
        early.stdin.close()
    except BrokenPipeError:
        pass
    return early


def run_worker(ident: NodeIdentity, opts: LaunchOptions, env: dict, ip: str, ray_cmd: list[str]) -> int:
    ports = ports_for(ident, opts)
    head = ident.head_address
    gcs = f"{head}:{ports.gcs}"
    deadline = time.monotonic() + opts.join_timeout_s
    log(ident, f"waiting for the head at {gcs}")
    wait_until(lambda: port_open(head, ports.gcs), timeout_s=opts.join_timeout_s, what=f"the head {gcs}",
               hint="check that the head started and that this node reaches it (address, firewall)")

    def head_gone() -> Optional[str]:
        return None if port_open(head, ports.gcs) else f"the head's GCS {gcs} no longer answers"

    def leave_head_lost(why: str) -> int:
        log(ident, f"the head is gone before it published the driver's exit code: {why}; leaving with "
                   f"{EXIT_HEAD_LOST} (the driver's code is the head's)")
        return EXIT_HEAD_LOST

    def tell_head(state: str, attempt: int, cause: str) -> None:
        record = node_records.NodeRecord(ident.node_rank, ident.hostname, socket.gethostname(), ip,
                                         ports.node_manager, state, attempt, cause[:2000])
        node_records.publish(gcs, record, env)
    # a worker's Ray leaves within seconds once the head is gone (Ray's default waits 60 s); only here,
    # where the GCS is another host's: a process that gives up on its GCS ends with code 1, skipping `finally`
    log(ident, "joining the cluster")
    try:
        node = _start(ident, ray_cmd, [f"--address={gcs}", *ports.node_args(), *temp_dir_args(ports, opts),
                                       *_start_args(opts, ident, ip)],
                      {**env, "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_RECONNECT_S)},
                      timeout_s=max(1.0, deadline - time.monotonic()), what="ray start (worker)", gate=_gate(opts),
                      on_retry=lambda attempt, cause: tell_head(node_records.RETRYING, attempt, cause),
                      stop_if=head_gone)
    except LaunchError as e:
        gone = head_gone()
        if gone:  # the head went while this node started: nothing to join, nobody to tell
            return leave_head_lost(f"{gone} ({e})")
        tell_head(node_records.FAILED, 0, str(e))
        raise
    log(ident, f"joined: this node's Ray is up at {ip}:{ports.node_manager}")
    agent: Optional[RayAgent] = None
    try:
        agent = RayAgent(gcs, env, "follow", "--lost-after", str(GCS_RECONNECT_S), "--nodes", str(ident.num_nodes))
        line = agent.next_line(node, None)
        kind, _, rest = line.partition(" ")
        if kind == EXIT:
            log(ident, "the held cluster was stopped; leaving" if opts.serve else C.driver_finished_line(int(rest)))
            return int(rest)
        if kind == LOST:
            return leave_head_lost(rest)
        gone = head_gone()  # this node's Ray may have seen it before the agent did
        if gone:
            return leave_head_lost(f"{gone} (this node's Ray exited too)")
        if node.returncode is not None:
            why = f"this node's Ray exited ({node.returncode}) before the driver finished: {node.cause()}"
        else:
            why = f"this node's Ray agent ended ({agent.proc.poll()}) before the driver finished; its output is above"
        log(ident, f"{why}; leaving with {EXIT_NODE_LOST}")
        tell_head(node_records.FAILED, 0, why)
        return EXIT_NODE_LOST
    finally:
        if agent:
            agent.stop(terminating=TERMINATING.is_set())
        _stop(node)


def _leave_on_sigterm(held: bool) -> None:
    """SIGTERM (a pod deleted or evicted, scancel, docker stop) ends this node at once, through the same
    cleanup as any exit, with the code a shell gives (143); a HELD cluster's node with 0, since SIGTERM is
    how `invoke down` ends it (on Slurm every step's processes get it). Needed because in a container this
    process is often PID 1, for which the kernel ignores signals that have no handler: the kubelet would
    wait its whole grace period and then SIGKILL. The head replaces the handler with one that forwards to
    the driver (or, held, stops serving)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda sig, _frame: _terminated(0 if held else 128 + sig))


def _terminated(code: int) -> None:
    TERMINATING.set()
    sys.exit(code)


def launch(cmd: list[str], opts: LaunchOptions, env_in: Optional[dict] = None) -> int:
    _leave_on_sigterm(opts.serve)
    env_in = dict(os.environ if env_in is None else env_in)
    spec = load_spec(env_in[C.SPEC_PATH]) if env_in.get(C.SPEC_PATH) else None
    ident = detect(env_in, spec)
    env = ray_env(opts)
    # Ray reads its auth settings when it is imported: this process must see them before `import ray`
    for key in ("RAY_AUTH_MODE", C.AUTH_TOKEN):
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
    if opts.serve:  # every process of a held cluster runs the code its run sent, never the image's copy
        env["PYTHONPATH"] = serving.without_image_code(env.get("PYTHONPATH", ""))
    ip = routable_ip(ident, opts.node_ip)
    env[C.NODE_IP] = ip  # Ray's workers inherit it: their log prefixes name the node as this line does
    if spec is not None and spec.fileroot:  # Ray Train's default storage: the shared fileroot (ray_train_defaults)
        job = env.get(C.JOB_NAME) or ""
        env.setdefault(ray_train_defaults.STORAGE_ENV,
                       f"{spec.fileroot.rstrip('/')}/ray_results/{job if re.fullmatch(C.JOB_NAME_RE, job) else 'job'}")
    log(ident, f"identity from {ident.source}: node {ident.node_rank} of {ident.num_nodes}, head {ident.head_address}, "
               f"ip {ip}, gpus {ident.gpus_per_node}, node {ident.node_name}: node type {ident.node_type}, "
               f"gpu type {ident.gpu_type}")
    check_shm(ident)
    ray_cmd = [ray_cli()]  # fail before anything starts
    if ident.is_head and not cmd and not opts.serve:
        raise LaunchError("no driver command given: python -m runtime launch -- python train.py ... "
                          "(or --serve, to hold the cluster for `python -m runtime run`)")
    if cmd and opts.serve:
        raise LaunchError("--serve holds the cluster without a driver; give no command (drivers come with "
                          "`python -m runtime run`)")
    # the zygote imports torch while this node waits for the head and the barrier; the raylet forks
    # its Python workers from it (runtime/cluster/zygote.py)
    zyg = zygote.start(env, lambda msg: log(ident, msg)) if opts.zygote else None
    try:
        if zyg:
            ray_cmd = zyg.ray_argv()
            # every process of this node's Ray can have it fork a process (a torchrun-style rank:
            # runtime/workers/script_ranks.py); a held cluster's drivers are forked from it too (serving)
            env[C.ZYGOTE_ENV] = zyg.socket
        if ident.is_head:
            return run_head(ident, opts, cmd, env, ip, ray_cmd)
        return run_worker(ident, opts, env, ip, ray_cmd)
    finally:
        if zyg:
            zyg.stop()

"""Scripts written for torchrun, unchanged, on the cluster the launcher formed:

    python -m runtime torchrun [--nproc-per-node K] [--max-restarts M] -- train.py ARGS   (or -m pkg.module ARGS)

Every node of the job runs K ranks of the script (default: the node's GPUs, or 1 without GPUs), each
a process with torchrun's environment as torchrun sets it (`rank_env`): RANK, LOCAL_RANK, GROUP_RANK
(the job's node rank: the head is 0), ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE,
GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free port on node 0, for rank 0's
store), TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and
TORCHELASTIC_USE_AGENT_STORE=False, so `init_process_group()` with no arguments, Lightning's
TorchElasticEnvironment and Accelerate find them. CUDA_VISIBLE_DEVICES is the node's (every GPU; the
rank picks by LOCAL_RANK); OMP_NUM_THREADS is the job's, else 1 when K > 1, as torchrun's.

A rank is a process forked from its node's zygote when there is one (torch imported:
runtime/cluster/zygote.py), else a new interpreter. The driver's own node's ranks are started by the
driver itself; each other node's by a Ray actor there (NodeRanks, no resources held), whose start (a
Ray worker: 0.7 s on a busy node) is all a one-node run would otherwise wait for. Every rank's lines
read `(nodeK@IP pid=P) [rankR] line`: the driver writes its own node's, Ray's log stream brings the
others'. Failures
follow torchrun: the first rank to exit non-zero stops the others (SIGTERM, SIGKILL after
STOP_GRACE_S), and the whole group starts again with TORCHELASTIC_RESTART_COUNT one higher, up to
MAX_RESTARTS; then the exit code is that rank's, and the message names it, its node and its last lines.
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Optional

import ray

from runtime import contract as C
from runtime import numbers
from runtime.errors import InputError
from runtime.workers import output_flush

STOP_GRACE_S = 10   # a rank told to stop has this long after SIGTERM before SIGKILL (torchrun: 30 s)
TAIL_LINES = 12
ROLE = "default"    # torchrun's role name when none is given


@dataclass(frozen=True)
class Node:
    """One node of the job: its rank (the launcher's), Ray's node ID, address and GPUs."""
    rank: int
    node_id: str
    ip: str
    gpus: int


def job_nodes() -> list[Node]:
    """The job's nodes in node-rank order, by the resource each launcher gives its node's Ray
    (contract.node_resource); a cluster started otherwise: the driver's node first, then by address."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    ranked = []
    for n in alive:
        marks = [k for k in n.get("Resources", {}) if k.startswith(C.NODE_RESOURCE_PREFIX)]
        if marks:
            ranked.append(Node(int(marks[0][len(C.NODE_RESOURCE_PREFIX):]), n["NodeID"], n["NodeManagerAddress"],
                               int(n.get("Resources", {}).get("GPU", 0))))
    if len(ranked) == len(alive):
        return sorted(ranked, key=lambda node: node.rank)
    here = ray.get_runtime_context().get_node_id()
    alive.sort(key=lambda n: (n["NodeID"] != here, n["NodeManagerAddress"], n["NodeID"]))
    return [Node(i, n["NodeID"], n["NodeManagerAddress"], int(n.get("Resources", {}).get("GPU", 0)))
            for i, n in enumerate(alive)]


def ranks_per_node(nodes: list[Node], given: Optional[int]) -> int:
    """--nproc-per-node, checked against the nodes' GPUs; its default: their GPUs, or 1 without GPUs."""
    gpus = {n.gpus for n in nodes}
    if given is None:
        if len(gpus) > 1:
            raise InputError(f"--nproc-per-node: the nodes have different GPU counts ({sorted(gpus)}); give it")
        return max(gpus.pop(), 1)
    fewest = min(gpus)
    if fewest and given > fewest:
        raise InputError(f"--nproc-per-node: {given} ranks per node, but a node has {fewest} GPU(s); give at most "
                         f"{fewest}, one rank per GPU")
    return given


def rank_env(node: Node, local_rank: int, nproc: int, nnodes: int, master: tuple[str, int], run_id: str,
             restart: int, max_restarts: int) -> dict:
    """A rank's torchrun variables (torch/distributed/elastic/agent/server/local_elastic_agent.py)."""
    world = nproc * nnodes
    rank = node.rank * nproc + local_rank
    return {"LOCAL_RANK": str(local_rank), "RANK": str(rank), "GROUP_RANK": str(node.rank), "ROLE_RANK": str(rank),
            "ROLE_NAME": ROLE, "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(world),
            "GROUP_WORLD_SIZE": str(nnodes), "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": master[0],
            "MASTER_PORT": str(master[1]), "TORCHELASTIC_RESTART_COUNT": str(restart),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts), "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}


@dataclass(frozen=True)
class Ended:
    """How one rank's process ended: its exit code (a signal N: 128+N, as a shell says it), its last lines,
    whether it was told to stop, and when it ended (its node's clock)."""
    code: int
    tail: tuple[str, ...]
    stopped: bool
    at: float = 0.0


class NodeRanks:
    """What runs one node's ranks, each a process, and passes their lines on, each named by its rank: an
    actor on that node, or (IN_DRIVER) an object in the driver for the driver's own node. Threaded: each rank's `run` waits for its process while `stop` and the others are served."""

    def __init__(self, node_rank: int, in_driver: bool = False):
        self.node_rank, self.ip = node_rank, ray.util.get_node_ip_address()
        self.pids: dict[int, int] = {}         # rank -> its process
        self.attempt = -1
        self.stopping = threading.Event()
        # Ray names an actor's lines; in the driver they are named here, the same way
        self.line_prefix = f"({self!r} pid={os.getpid()}) " if in_driver else ""

    def __repr__(self) -> str:  # Ray names the actor's lines with it: node1@10.0.0.2
        return f"node{self.node_rank}@{self.ip}"

    def free_port(self) -> tuple[str, int]:
        from runtime.workers import free_ports
        return self.ip, free_ports.any_port()

    def code_dir(self, driver_cwd: str) -> str:
        """Where the ranks run: the job's working_dir on this node (a held cluster's run), else the driver's."""
        return os.getcwd() if ray.get_runtime_context().runtime_env.get("working_dir") else driver_cwd

    def mark_output(self, line: str) -> None:
        """`line` on this actor's stdout and stderr, after every rank's line before it (output_flush)."""
        with _WRITING:
            for stream in (sys.stdout, sys.stderr):
                stream.write(line + "\n")
                stream.flush()

    def begin(self, attempt: int) -> None:
        """Attempt ATTEMPT starts: a stop for an earlier one is void from now on."""
        self.attempt = attempt
        self.stopping.clear()

    def run(self, attempt: int, rank: int, argv: list[str], contract: dict, omp: Optional[str], cwd: str) -> Ended:
        """Rank RANK of attempt ATTEMPT: `python ARGV` with its environment in CWD, until it ends."""
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # Ray set it for this actor
        env.update(contract)
        if omp:
            env["OMP_NUM_THREADS"] = omp
        tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pumps = [threading.Thread(target=_pump, args=(fd, stream, tail, f"{self.line_prefix}[rank{rank}] "),
                                  daemon=True)
                 for fd, stream in ((out_r, sys.stdout), (err_r, sys.stderr))]
        for p in pumps:
            p.start()
        ended_at: list[float] = []  # when it ended: the zygote's word, else when this process heard
        try:
            status = self._start(rank, argv, env, cwd, (out_w, err_w), ended_at.append) \
                if attempt == self.attempt else -signal.SIGTERM
        finally:
            os.close(out_w)
            os.close(err_w)
        ended_at.append(time.time())
        for p in pumps:
            p.join(timeout=5)
        self.pids.pop(rank, None)
        code = 128 - status if status < 0 else status
        return Ended(code, tuple(tail), self.stopping.is_set() or attempt != self.attempt, ended_at[0])

    def _start(self, rank: int, argv: list[str], env: dict, cwd: str, fds: tuple[int, int], on_end) -> int:
        socket_path = os.environ.get(C.ZYGOTE_ENV)
        with open(os.devnull, "rb") as devnull:
            if socket_path:
                from runtime.cluster.trampoline import fork_from_zygote
                status = fork_from_zygote(socket_path, argv, env, cwd, fds=(devnull.fileno(), *fds),
                                          on_pid=lambda pid: self._started(rank, pid), forward_signals=False,
                                          on_end=on_end)
                if status is not None:
                    return status
            proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdin=devnull, stdout=fds[0],
                                    stderr=fds[1], start_new_session=True)
            self._started(rank, proc.pid)
            return proc.wait()

    def _started(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid
        if self.stopping.is_set():  # told to stop while it was starting
            self._stop_one(rank, pid)

    def stop(self, attempt: int) -> None:
        """SIGTERM to each rank's process group, SIGKILL after STOP_GRACE_S (returns at once); a stop meant
        for an earlier ATTEMPT (calls to a threaded actor may overtake each other) does nothing."""
        if attempt != self.attempt:
            return
        self.stopping.set()
        for rank, pid in list(self.pids.items()):
            self._stop_one(rank, pid)

    def _stop_one(self, rank: int, pid: int) -> None:
        _signal_group(pid, signal.SIGTERM)

        def kill_later() -> None:
            time.sleep(STOP_GRACE_S)
            if self.pids.get(rank) == pid:
                _signal_group(pid, signal.SIGKILL)
        threading.Thread(target=kill_later, daemon=True).start()


def _signal_group(pid: int, sig: int) -> None:
    for target in (-pid, pid):  # its own group (a zygote child and a new session both have one)
        try:
            os.kill(target, sig)
            return
        except (ProcessLookupError, PermissionError):
            continue


_WRITING = threading.Lock()  # one line at a time: the node's ranks share its actor's stdout and stderr


def _pump(fd: int, stream, tail: collections.deque, prefix: str) -> None:
    with os.fdopen(fd, "rb", closefd=True) as f:
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            with _WRITING:
                stream.write(f"{prefix}{line}\n")
                stream.flush()


class _InDriver:
    """A NodeRanks in the driver's process (its node's ranks), called the way an actor is: `call` gives a
    future, `tell` does not wait."""

    def __init__(self, ranks: NodeRanks, threads: futures.ThreadPoolExecutor):
        self.ranks, self.threads = ranks, threads

    def call(self, method: str, *args, **kwargs) -> futures.Future:
        return self.threads.submit(getattr(self.ranks, method), *args, **kwargs)

    def tell(self, method: str, *args) -> None:
        getattr(self.ranks, method)(*args)


class _Actor:
    """A NodeRanks actor on another node, with _InDriver's calls."""

    def __init__(self, actor):
        self.actor = actor

    def call(self, method: str, *args, **kwargs) -> futures.Future:
        return getattr(self.actor, method).remote(*args, **kwargs).future()

    def tell(self, method: str, *args) -> None:
        getattr(self.actor, method).remote(*args)


def _node_hosts(nodes: list[Node], per_node: int, threads: futures.ThreadPoolExecutor) -> list:
    """Each node's NodeRanks: the driver's node's in this process, an actor pinned to each other node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    here = ray.get_runtime_context().get_node_id()
    return [_InDriver(NodeRanks(node.rank, in_driver=True), threads) if node.node_id == here else
            _Actor(ray.remote(NodeRanks).options(num_cpus=0, max_concurrency=per_node + 4, scheduling_strategy=
                                                 NodeAffinitySchedulingStrategy(node.node_id, soft=False))
                   .remote(node.rank))
            for node in nodes]


@dataclass(frozen=True)
class Failure:
    rank: int
    node: Node
    local_rank: int
    ended: Ended


# what a rank's last lines say when a peer left first (gloo, NCCL, a plain socket): that rank's failure
# follows another's, and its process can be reaped before the one that caused it
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe",
              "remote process exited", "ncclremoteerror")


def followed_a_peer(ended: Ended) -> bool:
    return any(words in line.lower() for line in ended.tail for words in _PEER_LOST)


def first_failure(failed: list[Failure]) -> Optional[Failure]:
    """The failure that ends the job, as the one torchrun names: the first to fail by when it ended (not by
    when the driver heard), among those whose lines do not show a peer lost before them."""
    return min(failed, key=lambda f: (followed_a_peer(f.ended), f.ended.at)) if failed else None


def script_argv(target: list[str], cwd: str) -> list[str]:
    """`python` ARGV of the target (`script.py ARGS` or `-m module ARGS`); a script must be in the code."""
    if not target:
        raise InputError("give the script: python -m runtime torchrun -- train.py ARGS (or -m package.module ARGS)")
    if target[0] == "-m":
        if len(target) < 2 or target[1].startswith("-"):
            raise InputError("-m: give the module to run, e.g. -m mypackage.train")
        return target
    if target[0].startswith("-"):
        raise InputError(f"{target[0]!r}: give the script first (train.py ARGS) or -m MODULE; torchrun's own "
                         "options go before --")
    path = target[0] if os.path.isabs(target[0]) else os.path.join(cwd, target[0])
    if not os.path.isfile(path):
        raise InputError(f"{target[0]!r}: no such script in {cwd}; give a path relative to the project's code")
    return target


def run_group(target: list[str], nproc: Optional[int] = None, max_restarts: int = 0, say=None) -> int:
    """Run TARGET as torchrun would, on every node of the cluster this driver is connected to; its exit code."""
    say = say or (lambda m: print(f"[torchrun] {m}", file=sys.stderr, flush=True))
    t0 = time.monotonic()
    cwd = os.getcwd()
    argv = script_argv(target, cwd)
    if not ray.is_initialized():
        ray.init()
    t_init = time.monotonic()
    nodes = job_nodes()
    per_node = ranks_per_node(nodes, nproc)
    run_id = os.environ.get(C.RUN_ID) or os.environ.get("TORCHELASTIC_RUN_ID") or "none"
    omp = os.environ.get("OMP_NUM_THREADS") or ("1" if per_node > 1 else None)
    threads = futures.ThreadPoolExecutor(max_workers=per_node + 4, thread_name_prefix="ranks")
    try:
        hosts = _node_hosts(nodes, per_node, threads)
        cwds = [f.result() for f in [h.call("code_dir", cwd) for h in hosts]]
        places = [(host, node, local, d) for host, node, d in zip(hosts, nodes, cwds) for local in range(per_node)]
        say(f"{len(nodes)} node(s) x {per_node} rank(s): world size {len(places)}, run {run_id}, up to "
            f"{max_restarts} restart(s) (ray.init {t_init - t0:.2f} s, the nodes' hosts "
            f"{time.monotonic() - t_init:.2f} s)")
        return _attempts(hosts, places, argv, omp, len(nodes), run_id, max_restarts, say)
    finally:
        threads.shutdown(wait=False, cancel_futures=True)


def _attempts(hosts: list, places: list, argv: list[str], omp: Optional[str], nnodes: int, run_id: str,
              max_restarts: int, say) -> int:
    """The group's attempts, until one ends with every rank at 0 or the restarts are spent; the exit code."""
    world = len(places)
    per_node = world // nnodes
    actors = [h.actor for h in hosts if isinstance(h, _Actor)]  # the lines Ray's log stream still carries
    failure: Optional[Failure] = None
    for restart in range(max_restarts + 1):
        master = hosts[0].call("free_port").result()
        for began in [h.call("begin", restart) for h in hosts]:
            began.result()
        running = {host.call("run", restart, rank=i, argv=argv, omp=omp, cwd=d, contract=rank_env(
                       node, local, per_node, nnodes, master, run_id, restart, max_restarts)): (i, node, local)
                   for i, (host, node, local, d) in enumerate(places)}
        failed: list[Failure] = []
        while running:
            done, _ = futures.wait(list(running), return_when=futures.FIRST_COMPLETED)
            for fut in done:
                i, node, local = running.pop(fut)
                try:
                    ended = fut.result()
                except ray.exceptions.RayActorError as e:
                    ended = Ended(1, (f"its host actor died ({type(e).__name__}): its node may have left",), False,
                                  time.time())
                if ended.code != 0 and not ended.stopped:
                    if not failed:
                        say(f"rank {i} (node {node.rank}, {node.ip}) exited with {ended.code}; stopping the other "
                            "ranks")
                        for h in hosts:
                            h.tell("stop", restart)
                    failed.append(Failure(i, node, local, ended))
        failure = first_failure(failed)
        output_flush.flush(actors, timeout_s=10)  # the ranks' lines before what this says of them
        if failure is None:
            say(f"all {world} ranks exited with 0")
            return 0
        if restart < max_restarts:
            say(f"restarting the group ({restart + 1} of {max_restarts}), TORCHELASTIC_RESTART_COUNT={restart + 1}")
    assert failure is not None
    lines = "\n    ".join(failure.ended.tail) or "(it printed nothing)"
    say(f"rank {failure.rank} (local rank {failure.local_rank} on node {failure.node.rank}, {failure.node.ip}) failed "
        f"first, with exit code {failure.ended.code}, after {max_restarts} restart(s); its last lines:\n    {lines}")
    return failure.ended.code


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime torchrun", description=__doc__.split("\n\n")[0],
                                epilog="Exit code: the first failing rank's, once the restarts are spent; 2: bad input.")
    p.add_argument("--nproc-per-node", type=numbers.arg_whole(1, C.TORCHRUN_MAX_NPROC), default=None,
                   help="Ranks on each node (default: the node's GPUs, or 1 without GPUs).")
    p.add_argument("--max-restarts", type=numbers.arg_whole(0, C.TORCHRUN_MAX_RESTARTS), default=0,
                   help="How often the whole group starts again after a rank fails (default 0), as torchrun's.")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- then the script and its arguments, or -m MODULE ...")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    try:
        return run_group(target, args.nproc_per_node, args.max_restarts)
    except InputError as e:
        print(f"torchrun: error: {e}", file=sys.stderr, flush=True)
        return 2

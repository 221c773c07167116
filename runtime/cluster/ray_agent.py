"""The launcher's connection to Ray, in a child process: `python -m runtime.cluster.ray_agent head|follow`.

The launcher owns the job's exit code, so its own process never loads Ray. Ray's core worker and
GCS client end their process with exit code 1 when the GCS stops answering for
`gcs_rpc_server_reconnect_timeout_s` (a stalled GCS on a loaded machine is enough), and that exit
skips every `finally`. In the launcher itself that turned the driver's code into 1 and left the
zygote running. Here that death only ends this agent, and the launcher reports it while it still
knows the driver's code.

`head`: connect as a driver, start the warm hosts, run the barrier, print `barrier <t>` on the
status pipe, then wait for `exit N` on stdin: publish N in the GCS for the workers, give them a
moment to leave, disconnect, print `published`.
`follow`: read the GCS until the head publishes the driver's code and print `exit N` on the status
pipe; print `lost <reason>` when the head is gone.
`report RECORD`: write a worker's record of its start (runtime/cluster/node_records.py) and end.
The head agent ends when stdin closes; both die with the launcher (runtime.cluster.lifeline).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Callable, Optional

from runtime import contract as C
from runtime import numbers
from runtime.cluster import node_records
from runtime.cluster.agent_client import BARRIER, ERROR, EXIT, LOST, PUBLISHED, say
from runtime.cluster.identity import NodeIdentity
from runtime.cluster.node_log import LaunchError, log
from runtime.wait import holds_within, wait_until

EXIT_KEY = b"raytrain:driver_exit"


class KvCount:
    """The GCS key-value operations this agent made, counted where they are made."""

    def __init__(self):
        self.put = self.get = self.list = 0

    def counted(self, kind: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            setattr(self, kind, getattr(self, kind) + 1)
            return fn(*args, **kwargs)
        return call

    def say(self, ident: Optional[NodeIdentity], role: str) -> None:
        if os.environ.get(C.KV_STATS) == "1":  # off by default: a line per node says nothing to a user
            log(ident, f"{role} agent kv operations: {self.put} put, {self.get} get, {self.list} list")


KV = KvCount()


def head(args, status_fd: int) -> int:
    import ray

    fields = json.loads(args.identity)
    ident = NodeIdentity(**{**fields, "node_addresses": tuple(fields["node_addresses"])})
    warm: Optional[Warmer] = None
    try:
        # log_to_driver: the warm hosts belong to this process's job, and their output (once a group
        # adopts them, the ranks') is printed on the head's output, as the driver's own workers' is
        ray.init(address=args.address, log_to_driver=True, logging_level="ERROR")
        # the ranks' markers (a driver's RayWorkerGroup.flush_output) pass here: noted in the GCS, not shown
        from runtime.workers import output_flush
        output_flush.watch_streams()
        # SIGTERM (the launcher going, or a scheduler that signals every process of the step, as
        # Slurm's scancel does) ends this process quietly, not through Ray's crash report
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
        warm = Warmer(ident, args.warm_hosts)  # held until the driver exits: it holds the warm hosts' handles
        last = barrier(ident, args.address, args.barrier_timeout, warm)
    except LaunchError as e:
        # no job: the warm hosts go before this node's Ray does (a Ray worker whose raylet goes first
        # aborts, and its "Fatal Python error: Aborted" would bury the one line that says what failed)
        if warm is not None:
            warm.release()
        ray.shutdown()
        say(status_fd, ERROR, e)
        return 2
    say(status_fd, BARRIER, f"{time.monotonic() - last:.6f}")
    word, _, code = sys.stdin.readline().strip().partition(" ")  # `exit N`, or EOF when the launcher is gone
    if word != EXIT or not code:
        KV.say(ident, "head")
        return 0
    from ray.experimental import internal_kv
    KV.counted("put", internal_kv._internal_kv_put)(EXIT_KEY, code.split()[0].encode(), overwrite=True)
    KV.say(ident, "head")
    _wait_workers_left(deadline=time.monotonic() + args.leave_timeout)
    ray.shutdown()  # before the GCS goes, or Ray's core worker ends this process with its own code
    say(status_fd, PUBLISHED)
    return 0


DEAD_GRACE_S = 10  # a node that died with no word from its launcher: time for the word to come


FOLLOW_POLL_S = 0.3     # a worker's poll for the driver's exit code, up to FOLLOW_NODES nodes
FOLLOW_NODES = 100      # beyond, each polls less often: the head's GCS answers about 330 gets a second in all
FOLLOW_POLL_MAX_S = 5.0


def follow_interval(num_nodes: int) -> float:
    """A worker's poll for the exit code: 0.3 s up to 100 nodes, then in proportion (3 s at 1,000, at
    most 5 s): the polls go on for the whole job, so at a fixed 0.3 s a 1,000-node job would ask the
    head's GCS 3,300 times a second until it ends. A worker learns the code at most one poll late."""
    return min(FOLLOW_POLL_MAX_S, FOLLOW_POLL_S * max(1.0, num_nodes / FOLLOW_NODES))


def poll_interval(num_nodes: int) -> float:
    """The barrier's poll: 0.1 s up to 200 nodes, then longer in proportion, up to 0.5 s from 1,000:
    each `ray.nodes()` returns every node (about 820 bytes each here), so at 1,000 nodes a 0.1 s poll
    would move 8 MB/s out of the GCS for a barrier that ends at most one poll after the last node."""
    return min(0.5, 0.1 * max(1.0, num_nodes / 200))


def barrier(ident: NodeIdentity, address: str, timeout_s: float,
            on_alive: Optional[Callable[[list], None]] = None) -> float:
    """Block until every expected node is alive; return the time the last one registered.
    on_alive(nodes) is called with the alive nodes at every poll.

    Fails at once when a worker reports that it gave up (runtime/cluster/node_records.py), naming it
    and its cause; a node that died is waited for while its launcher says it is starting again (or
    once an alive node has its place), and fails the barrier DEAD_GRACE_S after it died otherwise."""
    import ray
    from ray.experimental import internal_kv
    alive: list = []
    dead_since: dict = {}
    reader = node_records.Reader(KV.counted("list", internal_kv._internal_kv_list),
                                 KV.counted("get", internal_kv._internal_kv_get))
    latest: dict = {}  # rank -> its newest record

    def records() -> list:
        for rec in reader.new():
            if rec.state == node_records.FAILED:
                raise LaunchError(f"{rec.describe()} gave up before all {ident.num_nodes} nodes were up: {rec.cause}")
            log(ident, f"{rec.describe()}: its Ray start failed (attempt {rec.attempt}): {rec.cause}; it is trying again")
            if rec.rank not in latest or rec.attempt >= latest[rec.rank].attempt:
                latest[rec.rank] = rec
        return list(latest.values())

    def all_alive() -> Optional[float]:
        nodes = ray.nodes()
        alive[:] = [n for n in nodes if n["Alive"]]
        if on_alive:
            on_alive(alive)
        said = records()
        places = {(n["NodeManagerAddress"], n["NodeManagerPort"]) for n in alive}
        now = time.monotonic()
        for n in nodes:
            place = (n["NodeManagerAddress"], n["NodeManagerPort"])
            if n["Alive"] or place in places or any(rec.is_node(n) for rec in said):
                continue
            if now - dead_since.setdefault(n["NodeID"], now) > DEAD_GRACE_S:
                raise LaunchError(f"node {place[0]}:{place[1]} ({n['NodeManagerHostname']}) joined and then died "
                                  f"before all {ident.num_nodes} nodes were up, and its launcher said nothing: "
                                  "see that node's log")
        return time.monotonic() if len(alive) >= ident.num_nodes else None

    def too_late() -> LaunchError:
        joined = sorted(n["NodeManagerAddress"] for n in alive)
        missing = [a for a in ident.node_addresses if a not in joined] if ident.node_addresses else []
        detail = f"missing: {', '.join(missing)}" if missing else f"{ident.num_nodes - len(alive)} node(s) missing"
        return LaunchError(f"only {len(alive)}/{ident.num_nodes} nodes joined within {timeout_s:.0f}s "
                           f"(joined: {', '.join(joined)}; {detail}); check the workers' logs and that they reach "
                           f"{address}")
    return wait_until(all_alive, timeout_s=timeout_s, interval_s=poll_interval(ident.num_nodes), what="every node",
                      on_timeout=too_late)


class Warmer:
    """Starts `per_node` worker hosts on each node as it joins (a Ray worker process that imports
    torch), so the driver's first worker group finds them ready. What starts them is the worker
    half's, named by contract.WARM_HOSTS: the cluster half imports nothing of it. Called with the
    alive nodes at every poll of the barrier."""

    def __init__(self, ident: NodeIdentity, per_node: int):
        self.ident, self.per_node = ident, per_node
        self.started: set = set()
        self.hosts: list = []  # held for the whole job: a host lives while its creator holds its handle

    def __call__(self, nodes: list) -> None:
        for n in nodes:
            if self.per_node > 0 and n["NodeID"] not in self.started:
                self.started.add(n["NodeID"])
                try:
                    self.hosts.extend(C.resolve(C.WARM_HOSTS)(n["NodeID"], self.per_node))
                except Exception as e:  # an optimisation only: the group starts its own hosts
                    log(self.ident, f"could not warm up worker hosts on {n['NodeManagerAddress']}: {e}")

    def release(self, timeout_s: float = 10) -> None:
        """End the hosts now and wait until Ray lists none of them alive (no job will adopt them)."""
        import ray
        for h in self.hosts:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:  # a call on a killed actor fails as soon as Ray knows it is dead: then its process is gone
            gone = [h.__ray_ready__.remote() for h in self.hosts]
            ray.wait(gone, num_returns=len(gone), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - Ray itself is going; the node's stop ends what is left
            pass
        self.hosts.clear()


def _wait_workers_left(deadline: float) -> None:
    """Give workers a moment to read the exit code and leave cleanly before the head goes."""
    import ray

    holds_within(lambda: len([n for n in ray.nodes() if n["Alive"]]) <= 1,  # if not, they stop with the head
                 timeout_s=max(0.0, deadline - time.monotonic()), what="the workers to leave")


def follow(args, status_fd: int) -> int:
    """Read the driver's exit code from the GCS directly, not through a Ray driver: a driver attaches
    to "the" raylet of this node's IP, which is ambiguous when several nodes share an IP (several
    slurmd on one host) and unreachable when their /tmp is private (containers)."""
    from ray._raylet import GcsClient
    gcs = GcsClient(address=args.address)
    get = KV.counted("get", gcs.internal_kv_get)
    interval = follow_interval(args.nodes)
    lost_since = None
    while True:
        try:
            val = get(EXIT_KEY, None, timeout=2)
            lost_since = None
            if val is not None:
                KV.say(None, "follow")
                say(status_fd, EXIT, int(val))
                return 0
        except Exception as e:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > args.lost_after:
                say(status_fd, LOST, f"no answer from the head's GCS for {args.lost_after:.0f}s ({type(e).__name__})")
                return 0
        time.sleep(interval)


def report(args) -> int:
    """Write one node record in the head's GCS (best effort: the launcher goes on either way)."""
    from ray._raylet import GcsClient
    rec = node_records.NodeRecord.decode(args.record)
    KV.counted("put", GcsClient(address=args.address).internal_kv_put)(rec.key(), rec.encode().encode(), True, None,
                                                                        timeout=10)
    KV.say(None, f"node {rec.rank} report")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.cluster.ray_agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--status-fd", type=numbers.arg_whole(0, 65535), help="Pipe to report on (inherited from the launcher; head and follow).")
    parser.add_argument("--address", required=True, help="The head's GCS address, host:port.")
    sub = parser.add_subparsers(dest="role", required=True)
    hd = sub.add_parser("head", help="Warm hosts, barrier, then publish the driver's exit code.")
    hd.add_argument("--identity", required=True, help="The node's identity as JSON.")
    hd.add_argument("--barrier-timeout", type=numbers.arg_finite(0, 7 * 86400, low_open=True), required=True)
    hd.add_argument("--warm-hosts", type=numbers.arg_whole(0, 1024), required=True)
    hd.add_argument("--leave-timeout", type=numbers.arg_finite(0, 7 * 86400), required=True)
    fo = sub.add_parser("follow", help="Wait for the driver's exit code that the head publishes.")
    fo.add_argument("--lost-after", type=numbers.arg_finite(0, 7 * 86400, low_open=True), required=True)
    fo.add_argument("--nodes", type=numbers.arg_whole(1, numbers.COUNT_MAX), default=1,
                    help="The job's nodes: past 100, each worker polls for the exit code less often.")
    rp = sub.add_parser("report", help="Write a worker's record of its start in the head's GCS.")
    rp.add_argument("record", help="The record, as runtime.cluster.node_records.NodeRecord.encode() writes it.")
    args = parser.parse_args(argv)
    if args.role == "report":
        return report(args)
    if args.status_fd is None:
        parser.error(f"{args.role} needs --status-fd")
    return head(args, args.status_fd) if args.role == "head" else follow(args, args.status_fd)


if __name__ == "__main__":
    sys.exit(main())

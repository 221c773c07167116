"""How a RayWorkerGroup finds the worker and node behind a failed call (FailureDetector).

A call that fails with a dead actor, a timeout, or a task error while the workers were in a
collective (a peer's connection reset: Ray has not said yet which worker is gone) is traced to a
rank here; every call carries the rank each of its refs runs on. The lost rank is found by the
detector's own probes: every worker and one spare per node are asked at once; one still silent
LOST_GRACE_S after the others answered is lost, and its node is lost when nothing there answers.
The group then decides (RayWorkerGroup._fail): restart, or raise WorkerFailureError.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import ray

from runtime.errors import RaytrainError
from runtime.workers.worker_host import read_worker_log

# how long a failed collective waits for Ray to say which worker is gone (health checks take ~5 s)
PEER_CHECK_S = 20.0
# once the other workers have answered, how long a silent one gets before it counts as lost
LOST_GRACE_S = 1.0
# how long a probe of a suspect node may take before the node counts as lost: a host there (a
# spare or another rank) is a running process and answers at once; a task may first need a worker
# process started
NODE_PROBE_S = 0.5
NODE_PING_S = 3.0
# how long reading a failed worker's log on its node (up: else it is not asked) may take; a task there may
# first need a worker process started, seconds on a loaded node
LOG_TAIL_S = 20.0


class WorkerFailureError(RaytrainError, RuntimeError):  # RuntimeError: what user code caught before
    def __init__(self, message: str, rank: Optional[int] = None, node: Optional[str] = None):
        super().__init__(message)
        self.rank, self.node = rank, node


class WorkerGroupRestarted(WorkerFailureError):
    """The group was restarted after a failure; worker state is back at the last checkpoint."""


# Ray's note on any worker that exits unexpectedly lists the OOM killer and dying nodes among "common
# causes": the text from here on names no cause of this death
_RAY_GENERIC_NOTE = "Some common causes include"
# Ray's word that the node's raylet saw the actor's process end (an exit, a crash, its OOM kill): that
# node was up to say so. A lost node's actors end as unavailable (their connection closed) instead.
_RAY_PROCESS_DIED = "because its worker process has died"


def process_died(err: BaseException) -> bool:
    """Whether Ray says the actor behind ERR died as a process, seen by its node's raylet (the node is up);
    not where its node is being drained (`preempted`): that node is going."""
    return (isinstance(err, ray.exceptions.ActorDiedError) and not getattr(err, "preempted", False)
            and _RAY_PROCESS_DIED in str(err))


def dead_among(actors: list, node_of: Callable[[int], Optional[str]], timeout_s: float) -> list[int]:
    """The indices of ACTORS that are gone: the one liveness check of every worker group (runtime.workers
    and the NeMo RL face). Each is asked `__ray_ready__` at once; one Ray says is dead is dead, and one
    silent after TIMEOUT_S is dead when its node (NODE_OF(index): a Ray node ID) is. One that does not
    answer while its node is alive is busy (a call waits for the one running before it), not dead: a
    worker in a long call is not taken for dead and replaced."""
    refs = [a.__ray_ready__.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    dead, silent = [], []
    for i, ref in enumerate(refs):
        if ref not in ready:
            silent.append(i)
            continue
        try:
            ray.get(ref, timeout=0)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
            dead.append(i)
    if silent:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        dead += [i for i in silent if node_of(i) not in alive]
    return sorted(dead)


def death_cause(err: BaseException) -> str:
    """Why Ray says an actor is gone, in a word or two: 'OOM', 'node lost', or 'actor exit'."""
    text = str(err)
    if isinstance(err, ray.exceptions.OutOfMemoryError) or "NODE_OUT_OF_MEMORY" in text:
        return "OOM"
    said = text.split(_RAY_GENERIC_NOTE)[0]
    lower = said.lower()
    if "OOM" in said or "out of memory" in lower or "memory usage" in lower or "low on memory" in lower:
        return "OOM"
    if "node" in lower and ("died" in said or "dead" in said or "lost" in said or "preempted" in said):
        return "node lost"
    return "actor exit"


def format_phases(p: dict) -> str:
    """One line of a restart's phases, for logs and benchmarks."""
    return (f"failure seen at {p['failure_seen_at']:.3f}; lost rank found {p['lost_rank_found_s']:.2f} s; "
            f"node checked {p['node_check_s']:.2f} s; "
            f"torn down {p['teardown_s']:.2f} s; placement {p['placement_s']:.2f} s ({p['moved_groups']} moved); "
            f"hosts {p['hosts_s']:.2f} s ({p['spares_used']} spares, {p['new_hosts']} new, import {p['import_s']:.2f} s); "
            f"process group {p['dist_init_s']:.2f} s; worker init {p['worker_init_s']:.2f} s; "
            f"restart total {p['restart_s']:.2f} s")


@dataclass(frozen=True)
class WorkerProcess:
    """Where one rank's worker runs: its process id, and its node (Ray's node ID and address)."""
    pid: int
    node_id: str
    node: str


@dataclass(frozen=True)
class GroupView:
    """What FailureDetector reads of a worker group, as of the moment the group built it.

    workers[r] is rank r's actor and slots[r] its bundle; spares_by_node holds the spare hosts per node
    ID (asked along with the workers, so that one probe also tells which nodes still work); processes[r]
    is rank r's process, once the group has started (empty before); call_timeout_s names the limit in
    a stuck call's cause."""
    workers: tuple
    slots: tuple
    spares_by_node: Mapping[str, tuple] = field(default_factory=dict)
    processes: tuple = ()
    call_timeout_s: Optional[float] = None

    def spares_on(self, node_id: str) -> tuple:
        return self.spares_by_node.get(node_id, ())


@dataclass
class Failure:
    """Where a failed call failed: the rank (None: not known), why, and whether its node is lost;
    `detect` holds when it was seen and how long finding the rank and checking the node took."""
    rank: Optional[int]
    cause: str
    node_lost: bool
    detect: dict


class FailureDetector:
    """Finds the rank behind a failed call, and whether its node still works, with probes of its own.

    `view` returns the group's GroupView now (the workers change with every restart); the detector
    reads only that. It starts, kills and restarts nothing: the group decides what to do."""

    def __init__(self, view: Callable[[], GroupView]):
        self.view = view

    def locate(self, refs: list, ranks: list[int], err: Exception) -> Optional[Failure]:
        """The failure behind `err` from ray.get(refs), where refs[i] ran on rank ranks[i]; None when
        it is the user's own error (every worker still answers)."""
        seen = time.time()
        view = self.view()
        if isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                            ray.exceptions.WorkerCrashedError)):
            rank, cause, answered = self.find_failure(refs, err, ranks, view)
        else:
            # A collective (all-reduce) fails on the survivors, "connection reset by peer", before Ray
            # reports the lost worker: that is a worker failure, not an error in the user's code.
            rank, silent, answered = self.lost_worker(PEER_CHECK_S, view)
            if rank is None:
                return None
            how = "stopped answering" if silent else "died"
            cause = f"{how} while the others were in a collective ({str(err).splitlines()[0][:160]})"
        found = time.time()
        node_lost = rank is not None and not self.node_alive(rank, answered, view)
        detect = {"failure_seen_at": seen, "lost_rank_found_s": found - seen, "node_check_s": time.time() - found}
        return Failure(rank, cause, node_lost, detect)

    def lost_worker(self, within_s: float,
                    view: Optional[GroupView] = None) -> tuple[Optional[int], bool, Optional[set]]:
        """Which worker is gone, asking each one: (rank, silent, nodes that answered). A worker Ray
        reports dead is gone (silent=False). A worker on a lost node cannot answer, and Ray reports it
        only when its health checks declare the node dead (seconds): once the others have answered,
        one that stays silent LOST_GRACE_S longer is taken as lost (silent=True). (None, False, ...)
        when every worker answers: the error was the user's. Calls run beside a busy method
        (max_concurrency=2), so a busy worker still answers. One spare per node is asked too, so
        the same window tells which nodes still work; when Ray names a dead worker before the window
        is over, the nodes are that worker's alone where its raylet said the process ended, else None
        (not all asked yet: node_alive asks them itself)."""
        view = view or self.view()
        refs = [w.__ray_ready__.remote() for w in view.workers]
        nodes = {ref: sl.node_id for ref, sl in zip(refs, view.slots)}
        nodes.update({hosts[0].__ray_ready__.remote(): node for node, hosts in view.spares_by_node.items() if hosts})
        pending, answered, alive_nodes = list(nodes), set(), set()
        deadline, last = time.monotonic() + within_s, None
        while pending:
            limit = deadline if last is None else min(deadline, last + LOST_GRACE_S)
            if time.monotonic() >= limit:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, limit - time.monotonic()))
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                    if ref in refs:  # the others' answers are not all in: a silent spare proves nothing yet
                        return refs.index(ref), False, ({nodes[ref]} if process_died(e) else None)
                    continue
                alive_nodes.add(nodes[ref])
                if ref in refs:
                    answered.add(refs.index(ref))
                    last = time.monotonic()
        silent = [refs.index(r) for r in pending if r in refs]
        if silent and answered:
            return silent[0], True, alive_nodes
        return None, False, alive_nodes

    def node_alive(self, rank: int, alive_nodes: Optional[set] = None, view: Optional[GroupView] = None) -> bool:
        """Whether the node of `rank` still works: it is in ALIVE_NODES (something there answered, or its
        raylet said the worker's process ended: a probe of a loaded node can miss its window, that word
        cannot), or Ray has not declared it dead and something there answers: another rank or a spare
        (here within NODE_PROBE_S), or else a small task within NODE_PING_S (it may need a worker process
        started)."""
        view = view or self.view()
        node_id = view.slots[rank].node_id
        if alive_nodes and node_id in alive_nodes:
            return True
        if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
            return False
        if alive_nodes is not None and view.spares_on(node_id):
            return False  # its spare was asked with the others and stayed silent
        hosts = [w for r, w in enumerate(view.workers) if r != rank and view.slots[r].node_id == node_id]
        hosts += list(view.spares_on(node_id)[:1])
        if hosts:
            pending = [h.__ray_ready__.remote() for h in hosts]
            deadline = time.monotonic() + NODE_PROBE_S
            while pending and time.monotonic() < deadline:
                ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                try:
                    ray.get(ready, timeout=0)
                    if ready:
                        return True
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                    continue
            return False
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        ping = read_worker_log.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            pid=-1, lines=0)
        try:
            ray.get(ping, timeout=NODE_PING_S)
            return True
        except Exception:
            return False

    def log_tail(self, rank: Optional[int], lines: int = 20) -> str:
        """The failing worker's last log lines, read on its node (if that node is still up)."""
        processes = self.view().processes
        if rank is None or rank >= len(processes) or processes[rank] is None:
            return ""
        proc = processes[rank]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        try:
            text = ray.get(read_worker_log.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                proc.node_id, soft=False)).remote(pid=proc.pid, lines=lines), timeout=LOG_TAIL_S)
        except ray.exceptions.GetTimeoutError:
            return f"\n  (no log tail: node {proc.node} did not send it within {LOG_TAIL_S:.0f} s)"
        except Exception:
            return f"\n  (no log tail: node {proc.node} is gone)"
        return f"\n  last log lines of rank {rank}:\n    " + "\n    ".join(text.splitlines()) if text else ""

    def find_failure(self, refs: list, err: Exception, ranks: list[int],
                     view: Optional[GroupView] = None) -> tuple[Optional[int], str, Optional[set]]:
        """(the rank whose call failed, why, the nodes known to work as lost_worker gives them: that rank's
        where its raylet said the process ended, else None, for node_alive to ask)."""
        view = view or self.view()
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0)
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                    exited = process_died(e)
                    said = str(e).splitlines()[0] + (" (its process ended)" if exited else "")
                    return ranks[i], f"actor died: {said}", ({view.slots[ranks[i]].node_id} if exited else None)
                except Exception:
                    continue
        if isinstance(err, ray.exceptions.GetTimeoutError) and not_ready:
            return ranks[refs.index(not_ready[0])], f"no answer within {view.call_timeout_s}s (stuck)", None
        return None, str(err).splitlines()[0], None

"""runtime.workers.failures: death_cause on Ray's own words, and FailureDetector on a two-raylet Ray
cluster, given only a GroupView: plain actors stand in for a group's workers and spares, so no worker
group is built and the detector has nothing else to read."""
import os
import time

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.workers.failures import FailureDetector, GroupView, WorkerProcess, death_cause
from runtime.workers.virtual_cluster import BundleSlot

# Ray 2.60's words for an actor whose process exited (os._exit, a segfault) while a call was running: its
# note on the "common causes" of any such exit names the OOM killer and node deaths, which are not the cause
EXITED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: A\n\tip: 192.0.2.2\nThe actor is "
          "dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
          "unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
          "process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) "
          "the worker crashed unexpectedly due to SIGSEGV or another unexpected error. If the process was killed "
          "by the kernel OOM killer (verifiable by checking for OOM in dmesg of the OOMing node), consider enabling "
          "resource isolation via --enable-resource-isolation to prevent node deaths by resource contention")


def test_death_cause_reads_what_ray_says_of_this_death_not_its_list_of_common_causes():
    assert death_cause(RuntimeError(EXITED)) == "actor exit"
    assert death_cause(RuntimeError("The actor is dead because it was killed by `ray.kill`.")) == "actor exit"
    assert death_cause(RuntimeError("The actor is dead because its worker process has died. Worker exit type: "
                                    "NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running "
                                    "low on memory.")) == "OOM"
    assert death_cause(RuntimeError("The actor died because its node has died. Node Id: 27981e")) == "node lost"


class Probe:
    def say(self, text):
        print(text, flush=True)
        return os.getpid()

    def sleep(self, seconds):
        time.sleep(seconds)

    def exit(self, code):
        os._exit(code)


def on(node_id: str):
    # max_concurrency=2 as a group's WorkerHost: a worker inside a long call still answers a ping
    return ray.remote(Probe).options(num_cpus=0, max_concurrency=2, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def dead_within(actor, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.say.remote("still here"), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.cluster  # starts real Ray nodes
def test_the_detector_finds_the_lost_rank_its_node_and_log_from_a_view_alone(two_nodes):
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    ids = sorted(nodes)
    workers = [on(node) for node in ids]
    spare = on(ids[1])
    pids = ray.get([w.say.remote(f"probe rank {r} here") for r, w in enumerate(workers)])
    slots = tuple(BundleSlot(None, 0, r, 0, nodes[node], 1, None, node) for r, node in enumerate(ids))
    view = GroupView(workers=tuple(workers), slots=slots, spares_by_node={ids[1]: (spare,)},
                     processes=tuple(WorkerProcess(pid=p, node_id=n, node=nodes[n]) for p, n in zip(pids, ids)),
                     call_timeout_s=1.5)
    detector = FailureDetector(lambda: view)  # no group: the view is all it has

    assert detector.lost_worker(5) == (None, False, set(ids))  # every worker and the spare answer
    assert "probe rank 0 here" in detector.log_tail(0)

    stuck = [workers[0].sleep.remote(5)]
    with pytest.raises(ray.exceptions.GetTimeoutError) as err:
        ray.get(stuck, timeout=1.5)
    failure = detector.locate(stuck, [0], err.value)
    assert failure.rank == 0 and failure.cause == "no answer within 1.5s (stuck)" and not failure.node_lost

    ray.kill(workers[1], no_restart=True)  # asynchronous: the test goes on once Ray reports the worker dead
    assert dead_within(workers[1], 60)
    rank, silent, answered = detector.lost_worker(5)
    assert (rank, silent) == (1, False)
    assert detector.node_alive(1, answered)  # its spare answered: the node works, only the worker is gone
    assert detector.log_tail(None) == "" and GroupView(workers=(), slots=()).processes == ()


@pytest.mark.cluster  # starts real Ray nodes
def test_a_worker_whose_process_ended_leaves_its_node_up_though_a_probe_there_cannot_answer(two_nodes, monkeypatch):
    """A worker that exits (its memory_limit, a crash) on a node with nothing else of the group: Ray's raylet
    says the process died, so the node is up, even where a probe could not answer in time (a loaded node,
    made certain here by a window of 0 s). Taking the node for lost would move its placement group and
    lose the worker's last lines."""
    import runtime.workers.failures as failures
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    ids = sorted(nodes)
    workers = [on(node) for node in ids]
    pids = ray.get([w.say.remote(f"rank {r} here") for r, w in enumerate(workers)])
    slots = tuple(BundleSlot(None, 0, r, 0, nodes[node], 1, None, node) for r, node in enumerate(ids))
    view = GroupView(workers=tuple(workers), slots=slots,
                     processes=tuple(WorkerProcess(pid=p, node_id=n, node=nodes[n]) for p, n in zip(pids, ids)))
    detector = FailureDetector(lambda: view)
    monkeypatch.setattr(failures, "NODE_PING_S", 0.0)
    assert not detector.node_alive(1)  # the probe alone would take the node for lost

    refs = [workers[0].sleep.remote(0), workers[1].exit.remote(137)]
    with pytest.raises(ray.exceptions.RayActorError) as err:
        ray.get(refs, timeout=60)
    failure = detector.locate(refs, [0, 1], err.value)
    assert failure.rank == 1 and not failure.node_lost
    assert failure.cause.startswith("actor died: ") and failure.cause.endswith("(its process ended)")
    assert "rank 1 here" in detector.log_tail(1)
    # a collective's error (a peer's connection reset) is traced by asking every worker: the same word
    assert detector.lost_worker(5) == (1, False, {ids[1]}) and detector.node_alive(1, {ids[1]})

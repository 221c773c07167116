"""runtime.workers.members, the worker-group core both groups keep their workers in, on a two-raylet Ray
cluster with plain actors as the members: what `start` returns (a handle, or an ObjectRef of one from a
builder actor, as the NeMo RL face's initializers give) becomes the place's handle; the liveness check
tells a dead actor from a busy one and from one silent on a lost node; a replacement is started with
again=True; the restart budget is spent once per restart and refused past it."""
import time

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.workers.failures import WorkerFailureError
from runtime.workers.members import Members


@ray.remote(num_cpus=0)
class Member:
    def __init__(self, place: int, again: bool):
        self.place, self.again = place, again

    def who(self):
        return self.place, self.again

    def sleep(self, seconds: float):
        time.sleep(seconds)


@ray.remote(num_cpus=0)
class Builder:
    """Starts a member and returns its handle, as a NeMo RL initializer does."""
    def make(self, place: int, again: bool):
        return Member.remote(place, again)


@pytest.fixture
def builder(two_nodes):
    b = Builder.remote()
    yield b
    ray.kill(b)


def test_start_all_takes_handles_and_refs_and_replace_starts_again(builder):
    started = []

    def start(place, again):
        started.append((place, again))
        return builder.make.remote(place, again) if place % 2 else Member.remote(place, again)

    m = Members(start, nodes=lambda: [None] * 3, restart_on_failure=True, max_restarts=1)
    handles = m.start_all(3)
    assert started == [(0, False), (1, False), (2, False)]
    assert ray.get([h.who.remote() for h in handles]) == [(0, False), (1, False), (2, False)]
    old = handles[1]
    m.replace([1], wait_ready=True)
    assert m.handles[1] is not old and ray.get(m.handles[1].who.remote()) == (1, True)
    with pytest.raises(ray.exceptions.RayActorError):  # the replaced actor was killed, not restarted by Ray
        ray.get(old.who.remote(), timeout=10)
    assert ray.get([h.who.remote() for h in (m.handles[0], m.handles[2])]) == [(0, False), (2, False)]
    m.kill_all()
    assert m.handles == [] and m.dead(timeout_s=1) == []


def test_dead_is_the_killed_one_not_the_busy_one(two_nodes):
    node_ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    m = Members(lambda place, again: Member.remote(place, again), nodes=lambda: [node_ids[0]] * 3,
                restart_on_failure=False)
    m.start_all(3)
    ray.get([h.who.remote() for h in m.handles])
    busy = m.handles[2].sleep.remote(8)  # silent for the check's whole timeout, on a node that is alive
    ray.kill(m.handles[1], no_restart=True)
    assert m.dead(timeout_s=2) == [1]
    ray.get(busy)
    m.kill_all()


def test_silent_on_a_lost_node_is_dead(two_nodes):
    extra = two_nodes.add_node(num_cpus=1)
    two_nodes.wait_for_nodes()
    lost = extra.node_id
    pinned = NodeAffinitySchedulingStrategy(lost, soft=False)
    m = Members(lambda place, again: Member.options(scheduling_strategy=pinned).remote(place, again),
                nodes=lambda: [lost] * 2, restart_on_failure=False)
    m.start_all(2)
    ray.get([h.who.remote() for h in m.handles])
    busy = [h.sleep.remote(60) for h in m.handles]  # silent to the check; then their node goes
    two_nodes.remove_node(extra, allow_graceful=False)
    deadline = time.monotonic() + 60
    while any(n["Alive"] for n in ray.nodes() if n["NodeID"] == lost) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert m.dead(timeout_s=2) == [0, 1]
    del busy
    m.kill_all()


def test_restart_budget_is_spent_once_per_restart_and_refused_past_it():
    m = Members(lambda place, again: None, nodes=lambda: [None] * 3, restart_on_failure=True, max_restarts=2)
    assert m.can_restart() and m.spend_restart([1]) == 1
    assert m.spend_restart([]) == 1  # nothing dead: nothing spent
    assert m.spend_restart([2]) == 2 and not m.can_restart()
    with pytest.raises(WorkerFailureError, match=r"worker\(s\) \[3, 4\] are gone .* used its 2 restart\(s\)") as e:
        m.spend_restart([3, 4])
    assert e.value.rank == 3 and m.restarts == 2
    off = Members(lambda place, again: None, nodes=lambda: [None] * 3, restart_on_failure=False, max_restarts=5)
    assert not off.can_restart()
    for dead in ([], [1]):
        with pytest.raises(WorkerFailureError, match="without restart_on_failure=True"):
            off.spend_restart(dead)
    assert off.restarts == 0

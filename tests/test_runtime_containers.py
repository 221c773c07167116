"""End to end on the cpu image: head + two workers as containers on a Docker network, started only
with the variables a scheduler gives (SkyPilot style), forming the cluster through the barrier."""
import json
import re
import time

import pytest

from bench.container_job import Job


def summary(logs: str) -> dict:
    line = next(l for l in logs.splitlines() if l.startswith("SUMMARY "))
    return json.loads(line[len("SUMMARY "):])


@pytest.fixture
def job(built):
    jobs = []

    def make(**kw):
        j = Job(built["cpu"]["local_ref"], **kw)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.close()


def test_workers_first_then_head_job_completes(job):
    j = job(train_args=["--steps", "30"])
    j.start(1)
    j.start(2)
    time.sleep(2)  # the workers really are up before the head: they must wait, not fail
    j.start(0)
    codes = [j.wait(r) for r in (0, 1, 2)]
    head = j.logs(0)
    assert codes == [0, 0, 0], head[-3000:]
    s = summary(head)
    assert s["steps"] == 30 and s["nodes"] == 3 and s["ranks_reported"] == [0, 1, 2]
    assert s["final_loss"] < s["first_loss"] / 10
    assert "barrier passed: 3 node(s) alive" in head
    assert "waiting for the head" in j.logs(1)


def test_head_killed_workers_leave_on_their_own(job):
    j = job(train_args=["--steps", "100000", "--step-delay", "0.2"])
    for r in (0, 1, 2):
        j.start(r)
    deadline = time.time() + 120
    while ") step 3 loss " not in j.logs(0):  # a rank's step line
        assert time.time() < deadline, j.logs(0)[-2000:]
        time.sleep(0.5)
    j.containers[0].get_wrapped_container().kill()
    t0 = time.time()
    codes = [j.wait(r, timeout=30) for r in (1, 2)]
    assert time.time() - t0 < 15
    assert all(c != 0 for c in codes)


def test_missing_token_is_a_clear_error(built, client):
    out = client.containers.run(built["cpu"]["local_ref"], ["python", "-m", "runtime", "launch", "--", "true"],
                                environment={"RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "1",
                                             "RAYTRAIN_HEAD_ADDRESS": "127.0.0.1"}, remove=False, detach=True)
    try:
        assert out.wait(timeout=60)["StatusCode"] == 2
        assert "RAY_AUTH_TOKEN is not set" in out.logs().decode()
    finally:
        out.remove(force=True)


def test_sigterm_ends_a_node_that_runs_as_pid_1(built, client):
    """In a pod the launcher is PID 1, for which the kernel ignores a signal that has no handler: a deleted
    or evicted pod would sit out its grace period and be SIGKILLed. It leaves on SIGTERM, with 143."""
    c = client.containers.run(built["cpu"]["local_ref"], ["python", "-m", "runtime", "launch"], detach=True,
                              environment={"RAYTRAIN_NODE_RANK": "1", "RAYTRAIN_NUM_NODES": "2",
                                           "RAYTRAIN_HEAD_ADDRESS": "head.invalid", "RAY_AUTH_TOKEN": "t" * 64})
    try:
        deadline = time.time() + 60
        while "waiting for the head" not in c.logs().decode(errors="replace"):
            assert time.time() < deadline, c.logs().decode(errors="replace")[-2000:]
            time.sleep(0.2)
        c.reload()
        assert c.attrs["State"]["Pid"] and c.top()["Processes"][0][-1].startswith("python -m runtime launch")
        t0 = time.monotonic()
        c.stop(timeout=60)  # SIGTERM, then SIGKILL after 60 s
        waited = time.monotonic() - t0
        assert c.wait(timeout=10)["StatusCode"] == 143 and waited < 30, (waited, c.logs()[-2000:])
    finally:
        c.remove(force=True)


def _wait_for(j, rank, text, timeout=180):
    deadline = time.time() + timeout
    while text not in j.logs(rank):
        assert time.time() < deadline, f"{text!r} never appeared:\n" + j.logs(rank)[-3000:]
        c = j.containers[rank].get_wrapped_container()
        c.reload()
        assert c.status in ("created", "running"), (f"node {rank} exited ({c.attrs['State']['ExitCode']}) before "
                                                    f"{text!r}:\n" + j.logs(rank)[-3000:])
        time.sleep(0.5)


def test_worker_killed_group_restarts_from_checkpoint(job):
    # 80 steps of 0.3 s: a rank's step line reaches the head's log through Ray's log monitor, seconds late
    # on a busy machine, and the kill must still come mid-run
    j = job(train_args=["--steps", "80", "--step-delay", "0.3", "--ckpt-every", "5", "--max-restarts", "2",
                        "--call-timeout", "60"])
    for r in (0, 1, 2):
        j.start(r)
    _wait_for(j, 0, ") step 12 loss ")  # a rank's step line
    # as a deleted pod or a preempted job is stopped: SIGTERM, SIGKILL after the grace period. The node
    # leaves at once (its Ray stopped within seconds), not when the grace period ends
    t0 = time.monotonic()
    j.containers[2].get_wrapped_container().stop(timeout=30)
    assert time.monotonic() - t0 < 15 and j.wait(2, timeout=5) == 143, j.logs(2)[-2000:]
    assert j.wait(0, timeout=300) == 0, j.logs(0)[-3000:]
    head = j.logs(0)
    s = summary(head)
    assert s["steps"] == 80 and s["restarts"] == 1
    # resumed from its last checkpoint (every 5 steps), not from step 0
    resumed = re.search(r"restarted the group \(1/2\); resuming at step (\d+)", head)
    assert resumed and int(resumed.group(1)) % 5 == 0 and 10 <= int(resumed.group(1)) < 80, head[-3000:]
    assert f"resumed from checkpoint at step {resumed.group(1)}" in head


def test_worker_failures_beyond_max_restarts_fail_cleanly(job):
    j = job(train_args=["--steps", "100000", "--step-delay", "0.3", "--max-restarts", "0", "--call-timeout", "60"])
    for r in (0, 1, 2):
        j.start(r)
    _wait_for(j, 0, ") step 5 loss ")
    j.containers[2].get_wrapped_container().kill()
    code = j.wait(0, timeout=180)
    head = j.logs(0)
    assert code == 1, head[-3000:]
    assert "[driver] FAILED: worker rank" in head and "failed after 0 restarts" in head

"""Starting a node's Ray again when a start fails (runtime/cluster/ray_node.py), and the records a
worker leaves for the head (runtime/cluster/node_records.py). Engine-free and Ray-free: `ray` here is a
small program that behaves as `ray start --block` does on the way out (its exit code and last line)
or on success (Ray's own "Ray runtime started." line, then blocking); the real Ray runs in test_launch."""
from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from runtime.cluster import node_records, ray_node

FAKE_RAY = textwrap.dedent("""
    import os, sys, time
    state = sys.argv[1]
    fail_first = int(sys.argv[2])
    n = int(open(state).read()) if os.path.exists(state) else 0
    open(state, "w").write(str(n + 1))
    if sys.argv[3] == "hang" and n < fail_first:
        print("INFO -- Local node IP: 10.0.0.1", flush=True)
        time.sleep(600)
    if n < fail_first:
        print("Exception: The current node timed out during startup.", flush=True)
        sys.exit(1)
    print("Ray runtime started.", flush=True)
    time.sleep(600)
""")


def fake_ray(tmp_path, fail_first: int, how: str = "exit") -> list[str]:
    script = tmp_path / "ray.py"
    script.write_text(FAKE_RAY)
    # ray_node appends `start --block ARGS`; the stand-in reads its own arguments first
    return [sys.executable, str(script), str(tmp_path / "count"), str(fail_first), how]


def attempts(tmp_path) -> int:
    return int((tmp_path / "count").read_text())


def test_a_failed_start_is_tried_again_with_a_line_each_time(tmp_path):
    said, retried = [], []
    node = ray_node.start(fake_ray(tmp_path, 1), [], dict(os.environ), timeout_s=60, what="ray start (worker)",
                          say=said.append, on_retry=lambda a, c: retried.append((a, c)))
    try:
        assert node.returncode is None and attempts(tmp_path) == 2
        assert said[0].startswith("ray start (worker) failed (attempt 1, after ")
        assert "exited with 1: Exception: The current node timed out during startup." in said[0]
        assert said[-1] == "ray start (worker) came up on attempt 2"
        assert retried == [(1, "ray start exited with 1: Exception: The current node timed out during startup.")]
    finally:
        node.stop()
    assert node.returncode is not None and not os.path.exists(node.log_path)


def test_a_start_that_never_comes_up_gives_up_at_the_deadline_with_the_cause(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ray_node.StartFailed) as e:
        ray_node.start(fake_ray(tmp_path, 99), [], dict(os.environ), timeout_s=12, what="ray start --head",
                       say=lambda m: None)
    assert time.monotonic() - t0 < 12
    assert attempts(tmp_path) >= 2
    assert f"ray start --head failed {attempts(tmp_path)} time(s) within 12s" in str(e.value)
    assert "The current node timed out during startup" in str(e.value)


def test_an_attempt_that_hangs_is_ended_with_its_process_group_and_tried_again(tmp_path):
    said = []
    node = ray_node.start(fake_ray(tmp_path, 1, "hang"), [], dict(os.environ), timeout_s=60, what="ray start",
                          say=said.append, attempt_s=2)
    try:
        assert attempts(tmp_path) == 2
        assert "did not say it started within 2s" in said[0] and "Local node IP" in said[0]
    finally:
        node.stop()


def record(**kw) -> node_records.NodeRecord:
    fields = dict(rank=1, host="n1", machine="n1.cluster", ip="10.0.0.2", port=20001, state="retrying",
                  attempt=1, cause="timed out")
    return node_records.NodeRecord(**{**fields, **kw})


def test_a_record_reads_back_as_written():
    rec = record()
    assert node_records.NodeRecord.decode(rec.encode()) == rec
    assert node_records.NodeRecord.decode(rec.encode().encode()) == rec


@pytest.mark.parametrize("raw", [
    '{"rank": "1"}',
    record().encode().replace('"retrying"', '"gone"'),
    record().encode().replace('"rank": 1', '"rank": true'),
    record().encode().replace('"port": 20001', '"port": 2.5'),
    record().encode().replace('"host": "n1"', '"host": 5'),
    record().encode()[:-1] + ', "extra": 1}',
    "[]", "not json",
])
def test_anything_else_is_not_a_record(raw):
    with pytest.raises(ValueError):
        node_records.NodeRecord.decode(raw)


def test_a_record_is_matched_to_rays_entry_by_port_and_address_or_machine():
    rec = record()
    assert rec.is_node({"NodeManagerPort": 20001, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "x"})
    assert rec.is_node({"NodeManagerPort": 20001, "NodeManagerAddress": "192.0.2.2", "NodeManagerHostname": "n1.cluster"})
    assert not rec.is_node({"NodeManagerPort": 20201, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "n1.cluster"})
    assert not rec.is_node({"NodeManagerPort": 20001, "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "n2"})


def test_the_reader_skips_what_is_not_a_record_and_reads_each_key_once():
    store = {node_records.PREFIX + b"1": record().encode().encode(), node_records.PREFIX + b"2": b"{bad",
             node_records.PREFIX + b"3": None}
    reader = node_records.Reader(lambda prefix: [k for k in store if k.startswith(prefix)], store.get)
    assert reader.new() == [record()]
    again = record(attempt=2)
    store[again.key()] = again.encode().encode()  # the node's next attempt: a new key
    assert reader.new() == [again]
    assert reader.new() == [] and reader.gets == 6  # 3; the new one and the listed-but-empty one again; that one again
    assert again.key() != record().key()


def test_no_retry_once_stop_if_gives_a_reason(tmp_path):
    """A worker stops trying when its head is gone: nothing to join."""
    with pytest.raises(ray_node.StartFailed, match="not trying again: the head's GCS no longer answers"):
        ray_node.start(fake_ray(tmp_path, 99), [], dict(os.environ), timeout_s=60, what="ray start (worker)",
                       say=lambda m: None, stop_if=lambda: "the head's GCS no longer answers")
    assert attempts(tmp_path) == 1


SLOW_RAY = textwrap.dedent("""
    import sys, time
    log = sys.argv[1]
    open(log, "a").write(f"begin {time.monotonic()}\\n")
    time.sleep(1.0)  # what a start costs
    open(log, "a").write(f"started {time.monotonic()}\\n")
    print("Ray runtime started.", flush=True)
    time.sleep(600)
""")


def test_nodes_sharing_a_host_take_turns_starting(tmp_path):
    """With a one-slot HostGate, four nodes started at once begin their `ray start`s one after another,
    each after the one before said it started and settled; without a gate they all begin at once."""
    import threading
    script = tmp_path / "slow_ray.py"
    script.write_text(SLOW_RAY)

    def run_four(gate, log):
        nodes = []

        def one():
            nodes.append(ray_node.start([sys.executable, str(script), str(log)], [], dict(os.environ), timeout_s=60,
                                        what="ray start", say=lambda m: None, gate=gate))
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for n in nodes:
            n.stop()
        events = [line.split() for line in log.read_text().splitlines()]
        return sorted(float(t) for kind, t in events if kind == "begin"), \
            sorted(float(t) for kind, t in events if kind == "started")

    begins, starts = run_four(ray_node.HostGate(tmp_path / "gate", 1), tmp_path / "gated.log")
    assert len(begins) == 4
    for later, earlier_started in zip(begins[1:], starts):  # each begins after the one before started + settled
        assert later >= earlier_started + ray_node.SETTLE_S - 0.5
    begins, _ = run_four(None, tmp_path / "ungated.log")
    assert begins[-1] - begins[0] < 1.0


@pytest.mark.parametrize("planted", ["a link to another directory", "a file", "writable by others",
                                     "another user's", "slots that are a fifo, a link and a directory"])
def test_the_host_gate_takes_only_a_private_directory_and_regular_slots(tmp_path, planted):
    """Anyone may make the gate's name in /tmp first. What is planted there is never written through,
    never waited on, and never a traceback: the start goes ahead, ungated where the directory is not this
    user's private one (said once), gated by the slots that are regular files otherwise."""
    import threading
    gate_dir, elsewhere = tmp_path / "gate", tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "a link to another directory":
        gate_dir.symlink_to(elsewhere)
    elif planted == "a file":
        gate_dir.write_text("x")
    elif planted == "writable by others":
        gate_dir.mkdir(mode=0o777)
        gate_dir.chmod(0o777)
    elif planted == "another user's":
        gate_dir.mkdir(mode=0o700)
        os.chown(gate_dir, 4242, 4242)
    else:
        gate_dir.mkdir(mode=0o700)
        os.mkfifo(gate_dir / "slot-0")
        (gate_dir / "slot-1").symlink_to(elsewhere / "victim")
        (gate_dir / "slot-2").mkdir()
    gate = ray_node.HostGate(gate_dir, 4)
    out: list = []
    t = threading.Thread(target=lambda: out.append(_take(gate)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the gate waited"
    gated, unusable = out[0]
    assert list(elsewhere.iterdir()) == []  # nothing made through a link
    if planted.startswith("slots"):
        assert gated and unusable is None and (gate_dir / "slot-3").is_file()
    else:
        assert not gated and unusable, unusable


def _take(gate):
    with gate.slot(time.monotonic() + 3) as gated:
        return gated, gate.unusable


def test_the_host_gate_s_own_directory_is_made_private(tmp_path):
    gate = ray_node.HostGate(tmp_path / "gate", 2)
    assert _take(gate) == (True, None)
    assert oct((tmp_path / "gate").stat().st_mode & 0o777) == "0o700"

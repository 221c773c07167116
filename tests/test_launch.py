"""The launcher on the host: several real Ray nodes on one machine (distinct ports), no mocks."""
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # starts real Ray nodes


ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train" / "train.py")


def node_env(rank, n, token, **extra):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * n),
           "SKYPILOT_NUM_NODES": str(n), "RAY_AUTH_TOKEN": token, **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def launch(rank, n, token, cmd=(), args=(), **extra):
    argv = [sys.executable, "-m", "runtime", "launch", "--port-base", "22000", "--port-stride", "200",
            "--num-cpus", "1", *args]
    if cmd:
        argv += ["--", *cmd]
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would block the node
    proc = subprocess.Popen(argv, env=node_env(rank, n, token, **extra), stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    return proc


def finish(procs, timeout=240):
    out = []
    try:
        for p in procs:
            code = p.wait(timeout=timeout)
            p.log.seek(0)
            out.append((code, p.log.read()))
        return out
    finally:
        for p in procs:  # never leave a node running for the next test
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)


def test_three_nodes_train_and_exit_together(tmp_path):
    token = secrets.token_hex(32)
    workers = [launch(r, 3, token) for r in (1, 2)]
    head = launch(0, 3, token, cmd=[sys.executable, TRAIN, "--steps", "20", "--cpus-per-worker", "0.5",
                                    "--fileroot", str(tmp_path)])
    (hc, hout), *rest = finish([head, *workers])
    assert hc == 0, hout[-3000:]
    assert [c for c, _ in rest] == [0, 0], [o[-1500:] for _, o in rest]
    s = json.loads(next(l for l in hout.splitlines() if l.startswith("SUMMARY "))[8:])
    assert s["nodes"] == 3 and s["ranks_reported"] == [0, 1, 2] and s["final_loss"] < s["first_loss"]
    assert (tmp_path / "checkpoints" / "example" / "ckpt.pt").exists()
    # every rank's lines reach the head's log through Ray, its prefix naming the rank, without colour
    # codes, Ray's INFO lines or its "[repeated Nx]" folding
    for rank in range(3):
        assert f"(rank{rank}@127.0.0.1 pid=" in hout, hout[-2000:]
    assert "\x1b[" not in hout and "[repeated" not in hout and " INFO " not in hout, hout[-2000:]
    # each step once per rank, with seconds since the driver started (no epoch stamp), all before the
    # SUMMARY (the example flushes the ranks' output first), and no empty prefixed line
    lines = hout.splitlines()
    summary_at = next(i for i, line in enumerate(lines) if line.startswith("SUMMARY "))
    steps = [re.search(r"\(rank(\d)@[^)]*\) step (\d+) loss [\d.]+ at (\d+\.\d\d)s$", line) for line in lines]
    seen = sorted((int(m.group(1)), int(m.group(2))) for m in steps if m)
    assert seen == [(r, st) for r in range(3) for st in range(1, 21)], seen
    assert all(float(m.group(3)) < 600 for m in steps if m)
    assert max(i for i, m in enumerate(steps) if m) < summary_at, "\n".join(lines[summary_at - 3:])
    assert not any(re.fullmatch(r"\([^)]* pid=\d+[^)]*\)\s*", line) for line in lines)
    assert "[driver] step" not in hout and "raytrain-output-mark" not in hout
    logs = hout + "".join(o for _, o in rest)
    assert "exporter agent" not in logs
    # what says nothing is left out: torch's c10d hostname warning, gloo's connection count (every rank
    # is connected); and no node's Ray worker aborts on the way out
    for noise in ("client socket cannot be retrieved", "[Gloo]", "peer ranks", "Fatal Python error"):
        assert noise not in logs, [line for line in logs.splitlines() if noise in line][:5]


def test_driver_exit_code_reaches_every_node():
    token = secrets.token_hex(32)
    worker = launch(1, 2, token)
    head = launch(0, 2, token, cmd=[sys.executable, "-c", "import sys; sys.exit(7)"])
    codes = [c for c, _ in finish([head, worker])]
    assert codes == [7, 7]


DRIVER = """
import json, sys, time
started, preloaded = time.time(), "torch" in sys.modules
import ray
ray.init()
print("DRIVER " + json.dumps({"started": started, "preloaded": preloaded, "argv": sys.argv[1:],
                              "nodes": len([n for n in ray.nodes() if n["Alive"]])}), flush=True)
sys.exit(3)
"""


def test_preloaded_driver_starts_its_script_after_the_barrier(tmp_path):
    """The driver process starts while the head waits for a late worker; the script's first line
    runs only once both nodes are up, with torch already imported; its exit code is everyone's."""
    (tmp_path / "drv.py").write_text(DRIVER)
    token = secrets.token_hex(32)
    head = launch(0, 2, token, cmd=[sys.executable, str(tmp_path / "drv.py"), "--flag", "a b"])
    time.sleep(8)  # the head is up and waiting; the preloaded driver has imported torch by now
    joined_after = time.time()
    worker = launch(1, 2, token)
    (hc, hout), (wc, wout) = finish([head, worker])
    assert (hc, wc) == (3, 3), hout[-3000:] + wout[-1500:]
    seen = json.loads(next(l for l in hout.splitlines() if l.startswith("DRIVER "))[7:])
    assert seen["preloaded"] is True and seen["argv"] == ["--flag", "a b"] and seen["nodes"] == 2
    assert seen["started"] > joined_after
    assert "imports preloaded" in hout


def test_barrier_deadline_names_missing_node(tmp_path):
    """...and the preloaded driver, started during the barrier, never runs its script."""
    (tmp_path / "drv.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    token = secrets.token_hex(32)
    head = launch(0, 2, token, cmd=[sys.executable, str(tmp_path / "drv.py")], args=["--barrier-timeout", "3"])
    (code, out), = finish([head])
    assert code == 2
    assert "only 1/2 nodes joined within 3s" in out
    assert not (tmp_path / "ran").exists()


def test_contradicting_scheduler_variables():
    head = launch(0, 2, secrets.token_hex(32), cmd=["true"], SLURM_JOB_ID="1", SLURM_NODEID="1",
                  SLURM_JOB_NODELIST="n[1-2]")
    (code, out), = finish([head])
    assert code == 2 and "SLURM_NODEID='1'" in out and "SKYPILOT_NODE_RANK='0'" in out


def processes_with(marker: str) -> dict[int, str]:
    """Every live process whose environment carries `marker` (all a launcher starts inherit it): pid -> command."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie has ended; only its parent's wait is missing
        except OSError:
            continue
        found[int(pid)] = cmd
    return found


def wait_for_line(proc, text, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.log.seek(0)
        out = proc.log.read()
        if text in out:
            return out
        assert proc.poll() is None, f"launcher ended ({proc.returncode}) before {text!r}:\n{out[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} within {timeout}s")


def test_launcher_killed_with_sigkill_leaves_nothing_running():
    """The zygote, the node's Ray, the Ray agent and the driver all die with their launcher."""
    marker = f"RAYTRAIN_TEST_MARK={secrets.token_hex(8)}"
    head = launch(0, 1, secrets.token_hex(32), cmd=[sys.executable, "-c", "import time; time.sleep(600)"],
                  RAYTRAIN_TEST_MARK=marker.split("=", 1)[1])
    try:
        wait_for_line(head, "barrier passed")
        running = processes_with(marker)
        assert any("runtime.cluster.zygote serve" in c for c in running.values()), running
        assert any("gcs_server" in c for c in running.values()), running
        head.kill()
        head.wait()
        deadline = time.monotonic() + 60
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_with(marker) == {}
    finally:
        for pid in processes_with(marker):
            os.kill(pid, 9)


def test_driver_code_survives_losing_the_gcs():
    """The head's Ray goes while the driver runs (its GCS killed, as when `ray start --block` ends the
    node because one of its processes died under load). Ray ends a process whose GCS is gone with its
    own code 1, skipping `finally`: the launcher's code must still be the driver's, and the worker
    leaves with EXIT_HEAD_LOST, saying why; nothing is left running."""
    from runtime.cluster.launch import EXIT_HEAD_LOST
    marker = secrets.token_hex(8)
    token = secrets.token_hex(32)
    worker = launch(1, 2, token, RAYTRAIN_TEST_MARK=marker)
    head = launch(0, 2, token, cmd=[sys.executable, "-c", "import sys, time; time.sleep(15); sys.exit(7)"],
                  RAYTRAIN_TEST_MARK=marker)
    wait_for_line(head, "barrier passed")
    gcs = [pid for pid, c in processes_with(marker).items() if "gcs_server" in c]
    assert len(gcs) == 1, gcs
    os.kill(gcs[0], 9)
    (hc, hout), (wc, wout) = finish([head, worker])
    assert hc == 7, hout[-4000:]
    assert wc == EXIT_HEAD_LOST and "before it published the driver's exit code" in wout, wout[-3000:]
    assert processes_with(marker) == {}


def hold_port(port: int) -> socket.socket:
    """A listening socket on PORT, as another process (or one not yet gone) holds it on a busy host."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen()
    return s


WORKER1_NODE_MANAGER = 22000 + 200 + 1  # launch(): --port-base 22000 --port-stride 200; rank 1's raylet


def test_a_worker_whose_ray_start_fails_tries_again_and_the_job_trains(tmp_path):
    """The first Ray start on one worker fails (its raylet's port is taken); its launcher starts it again
    within the join timeout, saying so; the head's log shows the retry; the job forms and trains."""
    token = secrets.token_hex(32)
    held = hold_port(WORKER1_NODE_MANAGER)
    try:
        workers = [launch(r, 3, token) for r in (1, 2)]
        head = launch(0, 3, token, cmd=[sys.executable, TRAIN, "--steps", "3", "--cpus-per-worker", "0.5",
                                        "--fileroot", str(tmp_path)])
        wait_for_line(workers[0], "failed (attempt 1", timeout=240)
    finally:
        held.close()
    (hc, hout), (w1, w1out), (w2, _) = finish([head, *workers])
    assert (hc, w1, w2) == (0, 0, 0), (hout[-3000:], w1out[-3000:])
    assert "ray start (worker) came up on attempt 2" in w1out, w1out[-3000:]
    assert "node 1 (" in hout and "its Ray start failed (attempt 1)" in hout, hout[-3000:]
    s = json.loads(next(l for l in hout.splitlines() if l.startswith("SUMMARY "))[8:])
    assert s["nodes"] == 3 and s["ranks_reported"] == [0, 1, 2]


def test_a_worker_that_gives_up_fails_the_head_at_once_naming_it():
    """A worker whose Ray never comes up gives up at its join timeout and tells the head, which fails
    within seconds (not at its own 300 s deadline), naming the node and the cause."""
    token = secrets.token_hex(32)
    held = hold_port(WORKER1_NODE_MANAGER)
    try:
        worker = launch(1, 2, token, args=["--join-timeout", "45"])  # one attempt or more: Ray waits 30 s for its raylet
        head = launch(0, 2, token, cmd=["true"])
        (wc, wout), = finish([worker])
        gave_up = time.monotonic()
        (hc, hout), = finish([head], timeout=60)
        took = time.monotonic() - gave_up
    finally:
        held.close()
    # how many attempts fit in 45 s depends on the machine's load: a loaded 2-core host fits one, whose
    # own start may still be running at the join timeout (then no "failed (attempt 1" line comes first)
    assert wc == 2 and re.search(r"ray start \(worker\) failed [0-9]+ time\(s\) within", wout), wout[-3000:]
    assert hc == 2, hout[-3000:]
    assert "node 1 (" in hout and "gave up before all 2 nodes were up" in hout, hout[-3000:]
    assert took < 20, took
    assert "nodes joined within" not in hout  # not the barrier's deadline, with its hint about the network


def test_a_worker_killed_before_the_barrier_fails_the_head_within_20s_naming_it():
    """A worker's launcher dies (SIGKILL: it can say nothing) after its node joined, before the barrier
    passed: its Ray dies with it, and the head fails within 20 s naming that node, not after 300 s."""
    token = secrets.token_hex(32)
    worker = launch(1, 3, token)  # node 2 never comes: the barrier cannot pass
    head = launch(0, 3, token, cmd=["true"])
    try:
        wait_for_line(worker, "joined: this node's Ray is up", timeout=240)
        worker.kill()
        killed = time.monotonic()
        (hc, hout), = finish([head], timeout=60)
        took = time.monotonic() - killed
    finally:
        finish([worker])
    assert hc == 2, hout[-3000:]
    assert f":{WORKER1_NODE_MANAGER} (" in hout and "joined and then died" in hout, hout[-3000:]
    assert took < 20, took
    assert "Fatal Python error" not in hout and "SIGABRT" not in hout, hout[-3000:]

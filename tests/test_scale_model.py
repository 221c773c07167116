"""The head's barrier at 200 simulated nodes (bench/scale_model.py: the barrier's own code against an
in-process stand-in for ray.nodes() and the GCS key-value store). In a child process: the model puts
its stand-in in place of the `ray` module."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = """
import json, sys
sys.path.insert(0, {bench!r}); sys.path.insert(0, {root!r})
import scale_model
from runtime.cluster.node_log import LaunchError
entry = {{"NodeID": "0" * 56, "Alive": True, "NodeManagerAddress": "", "NodeManagerHostname": "n",
          "NodeManagerPort": 20001, "Resources": {{"CPU": 2.0}}}}
try:
    r = scale_model.one(200, 0.5, 0.01, entry, held_back={held_back}, timeout_s=3)
    print(json.dumps({{"passed": True, **r}}))
except LaunchError as e:
    print(json.dumps({{"passed": False, "error": str(e)}}))
"""


def model(held_back=()) -> dict:
    code = MODEL.format(bench=str(ROOT / "bench"), root=str(ROOT), held_back=tuple(held_back))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_barrier_passes_with_every_simulated_node_reading_each_record_once():
    r = model()
    assert r["passed"] and r["warmed"] == 200, r
    assert r["records"] >= 1 and r["kv_get"] == r["records"]  # each retrying node's record read once
    assert r["rounds"] >= 2 and r["cpu_s"] > 0


def test_a_node_held_back_fails_the_barrier_naming_it():
    r = model(held_back=(57,))
    assert not r["passed"], r
    assert "only 199/200 nodes joined" in r["error"] and "missing: 10.0.0.57" in r["error"], r["error"]


def test_the_polls_that_last_the_whole_job_keep_the_heads_load_bounded():
    """A worker's poll for the exit code goes on for the whole job: past 100 nodes it slows in proportion,
    so the head's GCS answers about the same number of gets a second at 100 and at 1,000 nodes."""
    from runtime.cluster.ray_agent import follow_interval, poll_interval
    assert follow_interval(3) == follow_interval(100) == 0.3
    rate = {n: n / follow_interval(n) for n in (100, 1000)}
    assert abs(rate[1000] - rate[100]) < 1 and follow_interval(100_000) == 5.0
    assert poll_interval(3) == 0.1 and poll_interval(1000) == 0.5

"""A held cluster (launch --serve) and drivers sent to it (python -m runtime run), on real Ray nodes on
this host: each run's code reaches every node through Ray's working_dir, its workers are new processes
forked from the zygote, nothing of an earlier run's code survives, and SIGTERM ends the cluster with 0."""
import io
import json
import re
import secrets
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test_launch import finish, launch, node_env

pytestmark = pytest.mark.cluster  # starts real Ray nodes

DRIVER = r'''
import json, os, sys, time
FORKED = "torch" in sys.modules  # before any import of this script: forked from the head's zygote
import ray
t0 = time.monotonic()
ray.init(address=os.environ["RAY_ADDRESS"])
import marker
ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=0.1)
class Probe:
    def look(self):
        import importlib.util
        try:
            import marker
        except ImportError:  # say where this worker looked
            raise RuntimeError(repr((sys.path[:5], os.environ.get("PYTHONPATH"), os.getcwd())))
        return {"tag": marker.TAG, "forked": "torch" in sys.modules, "pid": os.getpid(), "cwd": os.getcwd(),
                "old_module": importlib.util.find_spec("only_in_v1") is not None}

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
actors = [Probe.options(scheduling_strategy=On(i, soft=False)).remote() for i in ids]
print("RESULT " + json.dumps({"driver_tag": marker.TAG, "driver_cwd": os.getcwd(), "driver_forked": FORKED, "workers": ray.get([a.look.remote() for a in actors]),
                              "first_call_s": time.monotonic() - t0}), flush=True)
sys.exit(int(os.environ.get("RAYTRAIN_TEST_EXIT", "0")))  # a run passes on RAYTRAIN_* only
'''


def code_dir(root: Path, tag: str, extra: dict | None = None) -> Path:
    d = root / tag
    d.mkdir()
    (d / "drive.py").write_text(DRIVER)
    (d / "marker.py").write_text(f"TAG = {tag!r}\n")
    for name, text in (extra or {}).items():
        (d / name).write_text(text)
    return d


def wait_serving(proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.log.seek(0)
        if "serving: the cluster is up" in proc.log.read():
            return
        assert proc.poll() is None, "the head exited before serving"
        time.sleep(0.3)
    raise AssertionError("the head did not start serving")


def run(code: Path, token: str, job: str, unpack: tuple[Path, bytes] | None = None, script: str = "drive.py", **env):
    """`python -m runtime run` of CODE's SCRIPT; UNPACK (root, tar): the code comes on stdin instead."""
    e = {**node_env(0, 2, token, RAYTRAIN_JOB_NAME=job), **env}
    e.pop("RAY_AUTH_TOKEN")  # the run needs no token: the head's driver gets its own
    extra = ["--unpack-stdin", str(unpack[0])] if unpack else []
    r = subprocess.run([sys.executable, "-m", "runtime", "run", "--code-dir", str(code), *extra, "--",
                        sys.executable, script], env=e, capture_output=True, timeout=180,
                       input=unpack[1] if unpack else b"")
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def code_tar(src: Path, rel: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(src, arcname=rel)
    return buf.getvalue()


def result(r) -> dict:
    m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
    assert m, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(m.group(1))


def test_runs_on_a_held_cluster_see_their_own_code_and_the_cluster_leaves_on_sigterm(tmp_path):
    token = secrets.token_hex(32)
    job = f"serve-{secrets.token_hex(3)}"
    worker = launch(1, 2, token, args=["--serve"], RAYTRAIN_JOB_NAME=job)
    head = launch(0, 2, token, args=["--serve"], RAYTRAIN_JOB_NAME=job)
    try:
        wait_serving(head)
        first = result(run(code_dir(tmp_path, "v1", {"only_in_v1.py": "X = 1\n"}), token, job))
        second_run = run(code_dir(tmp_path, "v2"), token, job, RAYTRAIN_TEST_EXIT="7")
        assert second_run.returncode == 7  # the driver's exit code is the run's
        second = result(second_run)
        for res, tag in ((first, "v1"), (second, "v2")):
            assert res["driver_tag"] == tag and res["driver_cwd"].endswith(tag) and res["driver_forked"]
            assert len(res["workers"]) == 2 and {w["tag"] for w in res["workers"]} == {tag}
            assert all(w["forked"] for w in res["workers"]), res  # from the zygote, torch already imported
            assert all("_ray_pkg_" in w["cwd"] for w in res["workers"])  # Ray's content-addressed working_dir
        assert [w["old_module"] for w in first["workers"]] == [True, True]
        assert [w["old_module"] for w in second["workers"]] == [False, False]  # nothing of v1 survives
        assert not {w["pid"] for w in first["workers"]} & {w["pid"] for w in second["workers"]}
        # into a container the code comes on the run's stdin (Pyxis, Kubernetes): unpacked once, by its name
        root = tmp_path / "unpacked"
        (tmp_path / "src").mkdir()
        tar = code_tar(code_dir(tmp_path / "src", "v3"), "code/h3")
        third = result(run(root / "code" / "h3", token, job, unpack=(root, tar)))
        assert third["driver_tag"] == "v3" and {w["tag"] for w in third["workers"]} == {"v3"}
        assert (root / "code" / "h3" / "marker.py").read_text() == "TAG = 'v3'\n"
        assert [p.name for p in (root / "code").iterdir()] == ["h3"]  # nothing half-unpacked left beside it
        assert head.poll() is None and worker.poll() is None  # runs come and go; the cluster stays
        head.send_signal(signal.SIGTERM)
        (head_code, head_log), (worker_code, _) = finish([head, worker], timeout=120)
        assert head_code == 0 and worker_code == 0, head_log[-3000:]
    finally:
        for p in (head, worker):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        finish([head, worker], timeout=60)


EVERY_RANK = r'''
import os, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init(address=os.environ["RAY_ADDRESS"])

@ray.remote(num_cpus=0.1)
class Rank:
    def __init__(self, rank):
        self.rank = rank

    def say(self):
        print("the same line on every rank", flush=True)

    def __repr__(self):  # Ray's prefix of this actor's lines
        return f"rank{self.rank}"

ids = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
ranks = [Rank.options(scheduling_strategy=On(node, soft=False)).remote(r) for r, node in enumerate(ids)]
ray.get([r.say.remote() for r in ranks])
time.sleep(4)  # the workers' lines reach the driver through each node's log monitor
'''


def test_a_run_shows_every_ranks_line_even_when_they_are_alike(tmp_path):
    """Ray's driver folds lines that several workers print alike into one; a held run shows each rank's."""
    token = secrets.token_hex(32)
    job = f"dedup-{secrets.token_hex(3)}"
    workers = [launch(r, 3, token, args=["--serve"], RAYTRAIN_JOB_NAME=job) for r in (1, 2)]
    head = launch(0, 3, token, args=["--serve"], RAYTRAIN_JOB_NAME=job)
    nodes = [head, *workers]
    try:
        wait_serving(head)
        code = tmp_path / "code"
        code.mkdir()
        (code / "every_rank.py").write_text(EVERY_RANK)
        r = run(code, token, job, script="every_rank.py")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        said = [line for line in (r.stdout + r.stderr).splitlines() if "the same line on every rank" in line]
        assert sorted(re.match(r"\((rank\d) pid=", line).group(1) for line in said) == ["rank0", "rank1", "rank2"], said
        assert not any("repeated" in line for line in said), said
        head.send_signal(signal.SIGTERM)
        assert [c for c, _ in finish(nodes, timeout=120)] == [0, 0, 0]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        finish(nodes, timeout=60)


def test_run_without_a_serving_head_says_so(tmp_path):
    job = f"none-{secrets.token_hex(3)}"
    r = run(code_dir(tmp_path, "v1"), "x", job)
    assert r.returncode == 1 and "no cluster is serving on this node" in r.stderr and "invoke up" in r.stderr
    stop = subprocess.run([sys.executable, "-m", "runtime", "stop"], env=node_env(0, 2, "x", RAYTRAIN_JOB_NAME=job),
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 1 and "stop: error: no cluster is serving on this node" in stop.stderr


def test_serve_refuses_a_driver_command():
    r = subprocess.run([sys.executable, "-m", "runtime", "launch", "--serve", "--", "python", "x.py"],
                       env=node_env(0, 1, "x"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--serve holds the cluster without a driver" in r.stderr

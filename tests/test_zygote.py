"""runtime.cluster.zygote: Ray workers forked from a process with torch imported. A real zygote and real
forks; the Ray tests run real single-node launches, the same driver with and without the zygote."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.cluster import trampoline as trampoline_module, zygote

pytestmark = pytest.mark.cluster  # real zygotes, forks and single-node Ray launches

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# a stand-in for Ray's default_worker.py: the trampoline only looks at the path's last two parts
FAKE_WORKER = """
import json, os, signal, sys
print(json.dumps({"torch": "torch" in sys.modules, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "x": os.environ.get("X"), "pgid_is_pid": os.getpgid(0) == os.getpid(), "ppid": os.getppid(),
                  "stdin": sys.stdin.read()}), flush=True)
if "--signal" in sys.argv:
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(os.environ.get("CODE", "0")))
"""


@pytest.fixture()
def fake_worker(tmp_path):
    path = tmp_path / "workers" / "default_worker.py"
    path.parent.mkdir()
    path.write_text(FAKE_WORKER)
    return path


@pytest.fixture()
def served(tmp_path):
    """A zygote serving on a socket in tmp_path, and the trampoline that reaches it."""
    sock = str(tmp_path / "z.sock")
    log = open(tmp_path / "zygote.log", "w+")
    proc = subprocess.Popen([PY, "-m", "runtime.cluster.zygote", "serve", "--socket", sock], cwd=ROOT, stderr=log,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while "ready" not in (tmp_path / "zygote.log").read_text():
            assert proc.poll() is None, (tmp_path / "zygote.log").read_text()
            assert time.monotonic() < deadline, "zygote not ready"
            time.sleep(0.1)
        yield proc, trampoline_module.python_for_raylet(str(tmp_path / "bin"), sock)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def run_trampoline(trampoline, argv, tmp_path, **env):
    return subprocess.run([trampoline, *argv], input="in", capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, **env})


def test_worker_start_is_forked_with_torch_and_keeps_argv_env_stdio_and_exit_code(served, fake_worker, tmp_path):
    proc, trampoline = served
    r = run_trampoline(trampoline, [str(fake_worker), "--a=1", "b"], tmp_path, X="x", CODE="5")
    assert r.returncode == 5, r.stderr
    out = json.loads(r.stdout)
    assert out == {"torch": True, "argv": ["--a=1", "b"], "cwd": str(tmp_path), "x": "x", "pgid_is_pid": True,
                   "ppid": proc.pid, "stdin": "in"}


def test_worker_killed_by_a_signal_kills_its_trampoline_the_same_way(served, fake_worker, tmp_path):
    _, trampoline = served
    r = run_trampoline(trampoline, [str(fake_worker), "--signal"], tmp_path)
    assert r.returncode == -signal.SIGTERM, r.stderr
    assert json.loads(r.stdout)["torch"] is True


def test_runtime_env_context_is_applied_and_anything_else_starts_plainly(served, fake_worker, tmp_path):
    _, trampoline = served
    setup = str(tmp_path / "workers" / "setup_worker.py")
    ctx = json.dumps({"command_prefix": [], "env_vars": {"X": "from-ctx"}, "py_executable": None})
    r = run_trampoline(trampoline, [setup, str(fake_worker), "--k", f"--serialized-runtime-env-context={ctx}",
                                    "--language=PYTHON"], tmp_path)
    out = json.loads(r.stdout)
    assert (out["torch"], out["x"], out["argv"]) == (True, "from-ctx", ["--k"])
    # a command prefix: the raylet's command as it is (here it runs the stand-in for setup_worker.py)
    (tmp_path / "workers" / "setup_worker.py").write_text(FAKE_WORKER)
    prefixed = json.dumps({"command_prefix": ["env"], "env_vars": {}})
    r = run_trampoline(trampoline, [setup, str(fake_worker), f"--serialized-runtime-env-context={prefixed}",
                                    "--language=PYTHON"], tmp_path)
    assert json.loads(r.stdout)["torch"] is False


def test_no_zygote_listening_starts_the_worker_plainly(fake_worker, tmp_path):
    trampoline = trampoline_module.python_for_raylet(str(tmp_path / "bin"), str(tmp_path / "absent.sock"))
    r = run_trampoline(trampoline, [str(fake_worker), "x"], tmp_path, CODE="3")
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert (out["torch"], out["argv"], out["stdin"]) == (False, ["x"], "in")
    # not a worker at all (the raylet's agents): the same interpreter, same arguments
    r = run_trampoline(trampoline, ["-c", "import sys; print(sys.executable, sys.argv[1:])", "y"], tmp_path)
    assert r.stdout.split() == [PY, "['y']"]


def test_trampoline_killed_takes_its_worker_with_it(served, tmp_path):
    _, trampoline = served
    path = tmp_path / "workers" / "default_worker.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text("import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    t = subprocess.Popen([trampoline, str(path)], stdout=subprocess.PIPE, text=True)
    child = int(t.stdout.readline())
    os.kill(child, 0)
    t.kill()
    t.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the worker outlived its trampoline"


def test_argv_plans():
    w = "/x/ray/_private/workers/default_worker.py"
    s = "/x/ray/_private/workers/setup_worker.py"
    assert trampoline_module._zygote_argv([w, "--a"], PY, "/t") == ([w, "--a"], {}, None)
    ctx = json.dumps({"command_prefix": ["cd", "'/tmp/ray/wd dir'", "&&"], "env_vars": {"PYTHONPATH": "/tmp/ray/wd dir"}})
    assert trampoline_module._zygote_argv([s, w, f"--serialized-runtime-env-context={ctx}", "--language=PYTHON"],
                                          PY, "/t") == ([w], {"PYTHONPATH": "/tmp/ray/wd dir"}, "/tmp/ray/wd dir")
    other = json.dumps({"command_prefix": ["conda", "activate", "x", "&&"]})
    assert trampoline_module._zygote_argv([s, w, f"--serialized-runtime-env-context={other}", "--language=PYTHON"],
                                          PY, "/t") is None
    assert trampoline_module._zygote_argv([s, "-S", w], PY, "/t") is None  # interpreter flags
    assert trampoline_module._zygote_argv([s, w, "--language=JAVA"], PY, "/t") is None
    assert trampoline_module._zygote_argv([s, w, '--serialized-runtime-env-context={"py_executable": "uv run"}',
                                "--language=PYTHON"], PY, "/t") is None
    assert trampoline_module._zygote_argv([s, w, '--serialized-runtime-env-context={"override_worker_entrypoint": "/e"}',
                                "--language=PYTHON"], PY, "/t") is None
    assert trampoline_module._zygote_argv(["-u", "/x/ray/dashboard/agent.py"], PY, "/t") is None


# ------------------------------------------------------------------ under a real Ray node

DRIVER = r"""
import json, os, sys, time, ray
ray.init()

@ray.remote(num_cpus=0)
class Probe:
    def __init__(self):
        self.torch_before_user_code = "torch" in sys.modules
    def info(self):
        import psutil, torch
        parent = " ".join(psutil.Process(os.getppid()).cmdline())
        return {"forked": "runtime.cluster.zygote serve" in parent, "torch_before": self.torch_before_user_code,
                "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                "x": os.environ.get("X"), "own_group": os.getpgid(0) == os.getpid(),
                "tensor": float(torch.ones(3).sum())}
    def pid(self):
        return os.getpid()
    def die(self):
        os._exit(3)

out = {}
for name, kw in (("plain", {}), ("cpus2", {"num_cpus": 2}), ("env", {"runtime_env": {"env_vars": {"X": "1"}}})):
    out[name] = ray.get(Probe.options(**kw).remote().info.remote(), timeout=120)
a = Probe.remote()
pid = ray.get(a.pid.remote())
ray.kill(a)
deadline = time.time() + 10
while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
    time.sleep(0.05)
out["killed_gone"] = not os.path.exists(f"/proc/{pid}")
b = Probe.remote()
try:
    ray.get(b.die.remote(), timeout=60)
    out["died"] = "no error"
except ray.exceptions.RayActorError:
    out["died"] = "RayActorError"
out["after"] = ray.get(Probe.remote().info.remote(), timeout=120)["tensor"]
print("PROBE " + json.dumps(out), flush=True)
"""


def launch_probe(tmp_path, *args):
    script = tmp_path / "probe.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "127.0.0.1",
           "SKYPILOT_NUM_NODES": "1"}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([PY, "-m", "runtime", "launch", "--port-base", "24000", "--no-auth", "--num-cpus", "2",
                        "--warm-hosts", "0", *args, "--", PY, str(script)],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(l for l in r.stdout.splitlines() if l.startswith("PROBE "))
    return json.loads(line[6:]), r.stderr


def test_ray_workers_forked_from_the_zygote_behave_like_plain_ones(tmp_path):
    forked, log = launch_probe(tmp_path)
    plain, _ = launch_probe(tmp_path, "--no-zygote")
    assert f"zygote on {socket.gethostname()}: ready" in log
    assert [forked[k]["forked"] for k in ("plain", "cpus2", "env")] == [True, True, True]
    assert [plain[k]["forked"] for k in ("plain", "cpus2", "env")] == [False, False, False]
    assert forked["plain"]["torch_before"] and not plain["plain"]["torch_before"]
    for k in ("plain", "cpus2", "env"):  # what the user's code sees: threads, env, process group, results
        for f in ("forked", "torch_before"):
            forked[k].pop(f)
            plain[k].pop(f)
        assert forked[k] == plain[k], k
    assert forked["cpus2"]["threads"] == 2 and forked["plain"]["threads"] == 1 and forked["env"]["x"] == "1"
    assert forked["killed_gone"] and forked["died"] == "RayActorError" and forked["after"] == 3.0
    assert {k: plain[k] for k in ("killed_gone", "died", "after")} == \
        {k: forked[k] for k in ("killed_gone", "died", "after")}


def test_a_noexec_temp_dir_means_no_zygote_with_the_reason(tmp_path):
    mnt = tmp_path / "noexec"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=8m", "none", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a noexec tmpfs here (needs root)")
    try:
        said = []
        env = {**os.environ, "TMPDIR": str(mnt)}
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(mnt)
        import tempfile
        tempfile.tempdir = None  # re-read TMPDIR
        try:
            assert zygote.start(env, said.append) is None
        finally:
            os.environ.pop("TMPDIR") if old is None else os.environ.update(TMPDIR=old)
            tempfile.tempdir = None
        assert "noexec" in said[0] and str(mnt) in said[0]
        assert list(mnt.iterdir()) == []  # nothing left behind
    finally:
        subprocess.run(["umount", str(mnt)])

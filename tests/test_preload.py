"""runtime.cluster.preload: the driver process that imports while the barrier waits. Real processes, no mocks."""
import json
import subprocess
import sys
from pathlib import Path

from runtime.cluster.preload import Target, target_of

ROOT = Path(__file__).resolve().parent.parent

REPORT = """
import json, os, sys
seen = {"name": __name__, "argv": sys.argv, "path0": sys.path[0], "torch_before_import": "torch" in sys.modules,
        "stdin": sys.stdin.read()}
print("REPORT " + json.dumps(seen), flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def test_which_commands_are_preloaded():
    py = sys.executable
    assert target_of([py, "train.py", "--steps", "3"]) == Target("train.py", None, ("--steps", "3"))
    assert target_of([py, "-m", "pkg.train", "-x"]) == Target(None, "pkg.train", ("-x",))
    # not the same run as `python ...` would be, or not this interpreter's packages: started as they are
    assert target_of([py, "-u", "train.py"]) is None
    assert target_of([py, "-c", "print(1)"]) is None
    assert target_of([py]) is None
    assert target_of(["bash", "train.py"]) is None
    assert target_of(["/nonexistent/bin/python", "train.py"]) is None
    assert target_of(["true"]) is None


def run(argv, stdin: bytes, cwd, preloaded=True, **env):
    """The driver command, preloaded (go on stdin) or as plain `python ARGV`."""
    import os
    head = [sys.executable, "-m", "runtime.cluster.preload", "--"] if preloaded else [sys.executable]
    return subprocess.run([*head, *argv], input=stdin, capture_output=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=120)


def report(proc) -> dict:
    return json.loads(next(l for l in proc.stdout.decode().splitlines() if l.startswith("REPORT "))[7:])


def test_script_runs_as_python_would_after_go(tmp_path):
    sub = tmp_path / "job"
    sub.mkdir()
    (sub / "drv.py").write_text(REPORT)
    (tmp_path / "link.py").symlink_to(sub / "drv.py")
    for script in (str(sub / "drv.py"), "link.py"):
        argv = [script, "a b", "--x"]
        pre, plain = run(argv, b"go\n", tmp_path, EXIT_WITH="5"), run(argv, b"", tmp_path, False, EXIT_WITH="5")
        assert pre.returncode == plain.returncode == 5, pre.stderr.decode()[-2000:]
        seen, want = report(pre), report(plain)
        assert seen["torch_before_import"] is True and want["torch_before_import"] is False
        for key in ("name", "argv", "path0", "stdin"):
            assert seen[key] == want[key], key
        assert seen["path0"] == str(sub.resolve())


def test_module_runs_as_python_m_would(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "drv.py").write_text(REPORT)
    pre, plain = run(["-m", "pkg.drv", "1"], b"go\n", tmp_path), run(["-m", "pkg.drv", "1"], b"", tmp_path, False)
    assert pre.returncode == plain.returncode == 0, pre.stderr.decode()[-2000:]
    seen, want = report(pre), report(plain)
    assert seen["torch_before_import"] is True
    for key in ("name", "argv", "path0", "stdin"):
        assert seen[key] == want[key], key


def test_without_go_the_script_never_runs(tmp_path):
    (tmp_path / "drv.py").write_text("open('ran', 'w').close()\n")
    for stdin in (b"", b"stop\n"):
        proc = run([str(tmp_path / "drv.py")], stdin, tmp_path)
        assert proc.returncode == 0, proc.stderr.decode()
        assert not (tmp_path / "ran").exists()


def test_a_failing_script_fails_as_python_would(tmp_path):
    (tmp_path / "drv.py").write_text("raise ValueError('bad input: --steps')\n")
    proc = run([str(tmp_path / "drv.py")], b"go\n", tmp_path)
    assert proc.returncode == 1 and "ValueError: bad input: --steps" in proc.stderr.decode()

"""Held clusters on the local target (invoke up / run / status / down), end to end on this engine:
a one-line change reaches the running cluster and shows in its first step on every rank, the image's
copy of the code is gone from the run, a change below the code is refused, and down leaves nothing
running."""
import re
import shutil
import uuid

import pytest

from conftest import ROOT, SPEC, make_settings
from toolchain import held, pipeline
from toolchain.config import DeploySettings
from toolchain.errors import ConfigError
from toolchain.hashing import tree_hash
from toolchain.progress import Reporter
from toolchain.records import read_builds, read_clusters, read_runs

OLD_PRINT = 'print(f"step {self.step} loss {value:.5f} at {time.time() - self.started_at:.2f}s", flush=True)'
NEW_PRINT = ('print(f"step {self.step} loss {value:.5f} CHANGED old_module="'
             ' + str(__import__("importlib.util").util.find_spec("helper_old") is not None), flush=True)')


@pytest.fixture
def project(session_dir):
    """A project of its own (code and runtime copies), built and pushed: the test edits its code."""
    root = session_dir / f"held-{uuid.uuid4().hex[:6]}"
    app = root / "app"
    shutil.copytree(ROOT / "examples" / "train", app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "helper_old.py").write_text("X = 1  # in the image, deleted before the run\n")
    shutil.copytree(session_dir / "runtime", root / "runtime")
    s = make_settings(root, app, runtime_dir=root / "runtime")
    own_requirements = [str(root / "runtime" / "requirements.txt"), str(app / "requirements.txt")]  # same text
    s = s.model_copy(update={"deploy": DeploySettings(name=f"held-{uuid.uuid4().hex[:6]}", nodes=3),
                             "project": s.project.model_copy(update={"requirements": own_requirements})})
    yield s
    shutil.rmtree(root, ignore_errors=True)


def test_up_run_status_down(client, registry, project, capfd):
    s, name = project, project.deploy.name
    assert OLD_PRINT in (s.path(s.project.app_dir) / "train.py").read_text()
    pipeline.build(s, str(SPEC), "cpu", Reporter())
    image = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]["repo_digest"]
    held.up(s, str(SPEC), "local", rep=Reporter(), name=name, nodes=3)
    try:
        with pytest.raises(ConfigError, match="already recorded"):
            held.up(s, str(SPEC), "local", rep=Reporter(), name=name, nodes=3)
        assert held.status(s, rep=Reporter(), name=name)[name]["up"]
        assert read_clusters(s.build_dir)[name].up_args == ["--spec", str(SPEC), "--nodes", "3"]  # what hints repeat
        app = s.path(s.project.app_dir)
        train = app / "train.py"
        train.write_text(train.read_text().replace(OLD_PRINT, NEW_PRINT))
        (app / "helper_old.py").unlink()
        capfd.readouterr()
        out = held.run(s, str(SPEC), rep=Reporter(), name=name,
                       command="python train.py --steps 3 --cpus-per-worker 0.5 --no-spares")
        logs = capfd.readouterr().out
        assert out["exit_code"] == 0, logs[-3000:]
        first = [line for line in logs.splitlines() if "step 1 loss" in line and "(rank" in line]
        # every rank's own first step: a held run does not fold the lines ranks print alike into one
        assert sorted(re.search(r"\(rank(\d+)@", line).group(1) for line in first) == ["0", "1", "2"], logs[-3000:]
        assert all("CHANGED old_module=False" in line for line in first), "\n".join(first)  # new code; the image's gone
        # each step once per rank (the driver prints none of its own), all before the SUMMARY
        lines = logs.splitlines()
        steps = [i for i, line in enumerate(lines) if re.search(r"\) step \d+ loss ", line)]
        assert len(steps) == 3 * 3 and "[driver] step" not in logs, logs[-3000:]
        assert max(steps) < next(i for i, line in enumerate(lines) if "SUMMARY " in line), logs[-3000:]
        assert '"trained_steps": 3' in logs
        run = read_runs(s.build_dir)[name]
        assert run.code_sha256 == tree_hash(app) == out["code_sha256"] and run.image == image
        # status names the last run's curves, in the cluster's fileroot (the example writes them there)
        assert held.status(s, rep=Reporter(), name=name)[name]["curves"] == f"/tmp/raytrain/runs/{name}/{run.run_id}"
        # the recorded code rebuilds as an image: its build records the same code hash
        pipeline.build(s, str(SPEC), "cpu", Reporter())
        assert read_builds(s.build_dir)["cpu"].code_sha256 == run.code_sha256

        # below the code: refused, with the redeploy command, and nothing is sent
        req = app / "requirements.txt"
        original = req.read_text()
        req.write_text(original + "six==1.16.0\n")
        with pytest.raises(ConfigError, match="requirements, the base or the image settings changed.*invoke up"):
            held.run(s, str(SPEC), rep=Reporter(), name=name)
        req.write_text(original)
        runtime_file = s.runtime_dir / "numbers.py"
        runtime_file.write_text(runtime_file.read_text() + "\n# changed\n")
        with pytest.raises(ConfigError, match="the runtime package"):
            held.run(s, str(SPEC), rep=Reporter(), name=name)
        assert read_runs(s.build_dir)[name].run_id == run.run_id  # the refused runs recorded nothing
    finally:
        held.down(s, rep=Reporter(), name=name)
    assert name not in read_clusters(s.build_dir)
    assert not client.containers.list(all=True, filters={"label": f"io.raytrain.job={name}"})
    assert not client.networks.list(filters={"label": f"io.raytrain.job={name}"})
    with pytest.raises(ConfigError, match="no held cluster"):
        held.run(s, str(SPEC), rep=Reporter(), name=name)

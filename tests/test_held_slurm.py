"""A held cluster on a real Slurm (three slurmd on this host): `invoke up --target slurm` submits the
job with its head serving, `invoke run` sends a one-line change and it shows in the first step, the
run needs no Ray token outside the job, a runtime change is refused, and `invoke down` ends the job."""
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, make_settings
from toolchain import held
from runtime.errors import InputError
from toolchain.errors import ConfigError
from toolchain.hashing import tree_hash
from toolchain.progress import Reporter
from toolchain.records import read_clusters, read_runs

pytestmark = pytest.mark.cluster  # a real Slurm and real Ray nodes

OLD_PRINT = 'print(f"step {self.step} loss {value:.5f} at {time.time() - self.started_at:.2f}s", flush=True)'
NEW_PRINT = 'print(f"step {self.step} loss {value:.5f} CHANGED-ON-SLURM", flush=True)'


def test_up_run_down_on_slurm(slurm, tmp_path, monkeypatch, capfd):
    cluster = slurm
    fileroot = tmp_path / "fileroot"
    spec = tmp_path / "seed.json"
    spec.write_text(json.dumps({
        "cluster_type": "slurm", "cluster_name": "seed", "fileroot": str(fileroot), "cpu_image": "raytrain-cpu",
        "gpu_image": "raytrain-gpu", "node_type_from_node_name": {"n\\d$": "cpu"}, "node_name_prefix": "n"}))
    app = tmp_path / "app"
    shutil.copytree(ROOT / "examples" / "train", app, ignore=shutil.ignore_patterns("__pycache__"))
    s = make_settings(tmp_path / "proj", app, runtime_dir=ROOT / "runtime")
    name = f"held-{uuid.uuid4().hex[:6]}"
    s = s.model_copy(update={"deploy": s.deploy.model_copy(update={"port_base": 26000, "time_limit": "10:00"})})
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    held.up(s, str(spec), "slurm", rep=Reporter(), name=name, nodes=3, port_stride=200, env=cluster.env)
    try:
        record = read_clusters(s.build_dir)[name]
        assert held.status(s, rep=Reporter(), name=name, env=cluster.env)[name]["up"]
        train = app / "train.py"
        train.write_text(train.read_text().replace(OLD_PRINT, NEW_PRINT))
        capfd.readouterr()
        out = held.run(s, str(spec), rep=Reporter(), name=name, env=cluster.env,
                       command=f"python train.py --steps 3 --cpus-per-worker 0.5 --no-spares --fileroot {fileroot}")
        logs = capfd.readouterr().out
        assert out["exit_code"] == 0, logs[-4000:] + cluster.logs()
        assert any("step 1 loss" in line and "CHANGED-ON-SLURM" in line for line in logs.splitlines()), logs[-4000:]
        assert '"trained_steps": 3' in logs and '"ranks_reported": [0, 1, 2]' in logs
        code_sha = read_runs(s.build_dir)[name].code_sha256
        assert code_sha == tree_hash(app)
        # the code came on the run step's stdin, unpacked on the head (every slurmd here is this host)
        assert (Path("/tmp/raytrain-code") / code_sha[:16] / "train.py").read_text() == train.read_text()
        assert not (fileroot / "raytrain-code").exists()
        # the record edited to hold option-like values: refused when read, before the real tools run
        # (each logs its argv through a shim, then runs the real one), and the held job is still there
        shim, calls = tmp_path / "shim", tmp_path / "calls.log"
        shim.mkdir()
        for tool in ("squeue", "scancel", "srun"):
            (shim / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexec {shutil.which(tool)} "$@"\n')
            (shim / tool).chmod(0o755)
        clusters = s.build_dir / "clusters.json"
        good = clusters.read_bytes()
        shim_env = {**cluster.env, "PATH": f"{shim}{os.pathsep}{cluster.env.get('PATH', os.environ['PATH'])}"}
        for field, value in (("job_id", "--user=root"), ("head_node", "-w"), ("job_name", f"{name},LD_PRELOAD=/x.so")):
            bad = json.loads(good)
            bad[name]["handle"][field] = value
            clusters.write_text(json.dumps(bad))
            for step in (held.status, held.down):
                with pytest.raises(InputError, match=f"handle.{field}"):
                    step(s, rep=Reporter(), name=name, env=shim_env)
        clusters.write_bytes(good)
        assert not calls.exists(), calls.read_text()  # no argv reached squeue, scancel or srun
        assert held.status(s, rep=Reporter(), name=name, env=shim_env)[name]["up"]
        assert calls.read_text().startswith("squeue -h -j " + record.handle.job_id)
        runtime_copy = tmp_path / "runtime"  # a runtime other than the one the nodes run: refused
        shutil.copytree(ROOT / "runtime", runtime_copy, ignore=shutil.ignore_patterns("__pycache__"))
        (runtime_copy / "numbers.py").write_text((runtime_copy / "numbers.py").read_text() + "\n# changed\n")
        other = s.model_copy(update={"project": s.project.model_copy(update={"runtime_dir": str(runtime_copy)})})
        with pytest.raises(ConfigError, match="the runtime package"):
            held.run(other, str(spec), rep=Reporter(), name=name, env=cluster.env)
    finally:
        held.down(s, rep=Reporter(), name=name, env=cluster.env)
    fields = cluster.wait(record.handle.job_id, timeout_s=120)
    # down asks the head to stop: it publishes 0, the nodes leave in order and the script ends the job
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
    log = Path(record.handle.log).read_text()
    assert "raytrain: workers step exited with 0" in log and "raytrain: head exited with 0" in log, log[-3000:]
    assert log.count("the held cluster was stopped; leaving") == 2, log[-3000:]  # both workers, told by the head
    for noise in ("CANCELLED", "marked dead", "raylet exited", "SIGTERM received"):  # no process was signalled
        assert noise not in log, log[-3000:]
    assert name not in read_clusters(s.build_dir)

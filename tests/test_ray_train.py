"""A Ray Train script, unchanged, on the local target (runtime/cluster/ray_train_defaults.py): `RunConfig()`
with no storage_path keeps its checkpoints under the fileroot, where every node writes them, and a
resumed run (`deploy --resume`) finds the last one. Ray's state-API warning is said once."""
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import SPEC, make_settings
from toolchain import pipeline
from toolchain.progress import Reporter

TRAIN_SCRIPT = '''\
"""A Ray Train job written for the test: two workers, a checkpoint per epoch, resumed from the last one."""
import json
import os
import sys
import tempfile

import torch
import ray.train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["epoch"]
    model = ray.train.torch.prepare_model(torch.nn.Linear(1, 1))
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            if ray.train.get_context().get_world_rank() == 0:
                json.dump({"epoch": epoch + 1}, open(os.path.join(d, "state.json"), "w"))
            ray.train.report({"epoch": epoch + 1, "start": start}, checkpoint=Checkpoint.from_directory(d))


result = TorchTrainer(train_func, train_loop_config={"epochs": int(sys.argv[1])},
                      scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                      run_config=RunConfig()).fit()
print("RESULT " + json.dumps({"metrics": result.metrics, "path": result.path,
                              "checkpoint": result.checkpoint.path if result.checkpoint else None}))
'''


@pytest.fixture(scope="module")
def train_project(tmp_path_factory, app_dir, settings, built, registry):
    work = tmp_path_factory.mktemp("raytrain-project")
    app = work / "app"
    shutil.copytree(app_dir, app)
    (app / "rt_train.py").write_text(TRAIN_SCRIPT)
    with open(app / "requirements.txt", "a") as f:
        f.write("ray[train]==2.60.0\n")  # what a Ray Train user adds
    s = make_settings(work / "w", app, registry_address=settings.registry.address, runtime_dir=app_dir.parent / "runtime")
    s.registry.data_dir = settings.registry.data_dir
    pipeline.build(s, str(SPEC), "cpu", Reporter(quiet=True))
    pipeline.push(s, str(SPEC), "cpu", Reporter(quiet=True))
    return s


def result_of(text: str) -> dict:
    return json.loads(re.search(r"RESULT (\{.*\})", text).group(1))


def test_ray_train_checkpoints_go_to_the_fileroot_and_a_resumed_run_continues(client, train_project, capfd):
    name = f"rtrain-{uuid.uuid4().hex[:6]}"
    store = Path("/tmp/raytrain") / "ray_results" / name  # the spec's fileroot, bound into every container
    try:
        first = pipeline.deploy(train_project, str(SPEC), "local", rep=Reporter(), nodes=2, name=name,
                                command="python rt_train.py 2")
        text = "".join(capfd.readouterr())
        assert first.applied.exit_code == 0, text[-4000:]
        run_id = first.job["env"]["RAYTRAIN_RUN_ID"]
        got = result_of(text)
        assert got["metrics"]["epoch"] == 2 and got["metrics"]["start"] == 0
        assert got["path"] == str(store / run_id)  # RunConfig() with no storage_path or name: the job's, the run's
        assert got["checkpoint"].startswith(str(store / run_id)) and Path(got["checkpoint"], "state.json").is_file()
        assert text.count("State API may be temporarily unavailable") <= 1, text[-3000:]

        resumed = pipeline.deploy(train_project, str(SPEC), "local", rep=Reporter(), nodes=2, name=name,
                                  command="python rt_train.py 4", resume=True)
        text = "".join(capfd.readouterr())
        assert resumed.applied.exit_code == 0 and resumed.job["env"]["RAYTRAIN_RUN_ID"] == run_id, text[-4000:]
        got = result_of(text)
        assert got["metrics"]["epoch"] == 4 and got["metrics"]["start"] == 2, got  # from the last checkpoint
    finally:
        shutil.rmtree(store, ignore_errors=True)

"""The venv stage's last layer and the deps stage above it (toolchain/images.py `Builder.deps`), on
small images: loaded from one archive when the user stage is there, and the venv stage kept whole
when the user stage failed, so the next build does not write the venv again."""
from __future__ import annotations

import uuid

import docker
import pytest
from helpers.small_image import runnable_base
from test_layer_import import file_layer, imported

from toolchain import layers
from toolchain.errors import BuildError
from toolchain.images import Builder, VenvStage
from toolchain.progress import Reporter


class Beside:
    """The user stage's layers as `UserBeside` hands them over: saved from the engine, or its build's error."""

    def __init__(self, client, ref: str, dest, error: Exception | None = None):
        self.client, self.ref, self.dest, self.error = client, ref, dest, error
        self.prefetched = False

    def prefetch(self) -> None:
        self.prefetched = True

    def layers(self) -> list[layers.FileLayer]:
        if self.error is not None:
            raise self.error
        return layers.saved_layers(self.client, self.ref, self.dest)


@pytest.fixture
def stage(client, settings, tmp_path):
    """A venv stage as `Builder.venv` leaves it when the host compiled its bytecode: the bottom layer
    imported and tagged <ref>-layer, the bytecode layer and the stage's config pending."""
    suffix = uuid.uuid4().hex[:8]
    user_ref = f"raytrain-stagetest-user:{suffix}"
    runnable_base(client, user_ref)
    ref = f"raytrain-stagetest-stages:venv-{suffix}"
    bottom = file_layer(tmp_path, [("opt/venv/lib/mod.py", b"X = 1\n", False)])
    pyc = layers.make_layer([("opt/venv/lib/__pycache__/mod.cpython-311.pyc", b"compiled\n", False)])
    attrs = imported(client, bottom, f"{ref}-layer")
    diff_ids = [bottom.diff_id, pyc.diff_id]
    venv = VenvStage(ref, uuid.uuid4().hex, diff_ids, wh=None, pending=(pyc, layers.image_config(attrs, diff_ids)),
                     bottom_ref=f"{ref}-layer")
    builder = Builder(client, settings, Reporter(quiet=True))
    builder.venv = lambda *a, **kw: venv  # the stage above is what is tested here
    made = [f"{ref}-layer", ref, user_ref]
    yield builder, venv, user_ref, made
    for tag in reversed(made):
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_the_bytecode_and_the_stage_above_load_together(client, stage, tmp_path):
    builder, venv, user_ref, made = stage
    beside = Beside(client, user_ref, tmp_path / "saved")
    rebuilt: list = []
    ref, _, _ = builder.deps("u" * 64, "cpu", None, rebuilt, beside)
    made.append(ref)
    user_ids = client.images.get(user_ref).attrs["RootFS"]["Layers"]
    assert client.images.get(venv.ref).attrs["RootFS"]["Layers"] == venv.diff_ids
    assert client.images.get(ref).attrs["RootFS"]["Layers"] == [*venv.diff_ids, *user_ids]
    assert rebuilt == ["deps"] and venv.pending is None
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(venv.bottom_ref)  # the stage holds the layer; the temporary tag is gone
    assert (builder.layer_store / f"{venv.diff_ids[1][7:]}.tar").exists()  # the push reads the bytecode there
    out = client.containers.run(ref, ["/bin/cat", "/opt/venv/lib/mod.py", "/opt/venv/lib/__pycache__/mod.cpython-311.pyc"],
                                remove=True)
    assert out == b"X = 1\ncompiled\n"


def test_a_failed_user_stage_leaves_the_venv_stage_whole(client, stage, tmp_path):
    builder, venv, user_ref, _ = stage
    beside = Beside(client, user_ref, tmp_path / "saved", error=BuildError("user", user_ref, "useradd failed", []))
    rebuilt: list = []
    with pytest.raises(BuildError, match="useradd failed"):
        builder.deps("u" * 64, "cpu", None, rebuilt, beside)
    assert client.images.get(venv.ref).attrs["RootFS"]["Layers"] == venv.diff_ids
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(venv.bottom_ref)
    assert rebuilt == []

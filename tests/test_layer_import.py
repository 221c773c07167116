"""The engine side of the directly assembled layers (toolchain/layers.py), on small images: a layer
imported as the bottom of a chain keeps its diff ID, layers read back from `docker save` are the
engine's own, and a stack made of them runs."""
from __future__ import annotations

import hashlib
import uuid

import docker
import pytest
from helpers.small_image import runnable_base

from toolchain import layers


@pytest.fixture
def base(client):
    ref = f"raytrain-importtest-base:{uuid.uuid4().hex[:8]}"
    image_id = runnable_base(client, ref)
    yield ref
    client.images.remove(image_id, force=True)


def file_layer(tmp_path, files) -> layers.FileLayer:
    layer = layers.make_layer(files)
    path = tmp_path / f"{layer.diff_id[7:]}.tar"
    path.write_bytes(layer.data)
    return layers.FileLayer(path, layer.diff_id, layer.size)


def imported(client, layer: layers.FileLayer, tag: str, **kw) -> dict:
    """The layer fed to the engine block by block, as the venv layer is while it is written."""
    importing = layers.StreamedImport(client, tag, **kw)
    try:
        for block in layer.chunks():
            importing.feed(block)
        return importing.finish(layer)
    finally:
        importing.abort()


def test_a_layer_imported_and_the_base_reloaded_above_it_runs(client, base, tmp_path):
    bottom = file_layer(tmp_path, [("opt/venv/marker.txt", b"from the bottom layer\n", False)])
    tag = f"raytrain-importtest-bottom:{uuid.uuid4().hex[:8]}"
    seen: list[int] = []
    attrs = imported(client, bottom, tag, progress=seen.append)
    stacked = f"raytrain-importtest-stack:{uuid.uuid4().hex[:8]}"
    try:
        assert attrs["RootFS"]["Layers"] == [bottom.diff_id] and seen[-1] == bottom.size
        above = layers.saved_layers(client, base, tmp_path / "saved")
        base_attrs = client.images.get(base).attrs
        assert [a.diff_id for a in above] == base_attrs["RootFS"]["Layers"]
        for a in above:  # each file is the layer's tar, hashed to the diff ID the engine lists
            assert "sha256:" + hashlib.sha256(a.path.read_bytes()).hexdigest() == a.diff_id
        config = layers.image_config(base_attrs, [bottom.diff_id, *base_attrs["RootFS"]["Layers"]])
        image_id = layers.load(client, above, config, stacked)
        assert client.images.get(stacked).attrs["RootFS"]["Layers"] == [bottom.diff_id, *base_attrs["RootFS"]["Layers"]]
        assert image_id == "sha256:" + hashlib.sha256(config).hexdigest()
        out = client.containers.run(stacked, ["/bin/cat", "/opt/venv/marker.txt"], remove=True)
        assert out == b"from the bottom layer\n"  # the base's /opt above did not hide the bottom layer's files
    finally:
        for ref in (stacked, tag):
            try:
                client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_a_tar_that_is_not_the_layer_it_claims_is_refused(client, tmp_path):
    layer = file_layer(tmp_path, [("opt/x", b"x", False)])
    lying = layers.FileLayer(layer.path, "sha256:" + "0" * 64, layer.size)
    tag = f"raytrain-importtest-lie:{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(layers.BuildError, match="made layers"):
            imported(client, lying, tag)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_an_abandoned_import_leaves_no_image(client, tmp_path):
    """The venv's writer failed half way (a broken wheel, a full disk): the engine gets a cut stream and
    makes nothing of it."""
    layer = file_layer(tmp_path, [("opt/big", bytes(range(256)) * 8192, False)])
    tag = f"raytrain-importtest-cut:{uuid.uuid4().hex[:8]}"
    importing = layers.StreamedImport(client, tag)
    importing.feed(layer.path.read_bytes()[: layer.size // 2])
    importing.abort()
    assert not importing.thread.is_alive() and importing.error is not None
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)


def test_a_stage_and_the_stage_above_it_load_from_one_archive(client, base, tmp_path):
    """The venv's bytecode and the base above it, as the build loads them (toolchain/images.py `_deps`):
    one archive, two tags; the second image takes the layer the first one brought."""
    bottom = file_layer(tmp_path, [("opt/venv/mod.py", b"X = 1\n", False)])
    mid = file_layer(tmp_path, [("opt/venv/__pycache__/mod.pyc", b"compiled\n", False)])
    suffix = uuid.uuid4().hex[:8]
    tag, stage, top = (f"raytrain-importtest-{n}:{suffix}" for n in ("bottom", "stage", "top"))
    try:
        attrs = imported(client, bottom, tag)
        above = layers.saved_layers(client, base, tmp_path / "saved")
        base_attrs = client.images.get(base).attrs
        stage_config = layers.image_config(attrs, [bottom.diff_id, mid.diff_id])
        top_config = layers.image_config(base_attrs, [bottom.diff_id, mid.diff_id, *base_attrs["RootFS"]["Layers"]])
        ids = layers.load_images(client, [mid, *above], [(stage_config, stage), (top_config, top)])
        assert ids == ["sha256:" + hashlib.sha256(c).hexdigest() for c in (stage_config, top_config)]
        assert client.images.get(stage).attrs["RootFS"]["Layers"] == [bottom.diff_id, mid.diff_id]
        assert client.images.get(top).attrs["RootFS"]["Layers"] == [bottom.diff_id, mid.diff_id,
                                                                    *base_attrs["RootFS"]["Layers"]]
        out = client.containers.run(top, ["/bin/cat", "/opt/venv/mod.py", "/opt/venv/__pycache__/mod.pyc"], remove=True)
        assert out == b"X = 1\ncompiled\n"
        # an image whose layer neither the archive nor the engine has: refused, both tags named
        missing = file_layer(tmp_path, [("opt/missing", b"m", False)])
        lost = layers.image_config(attrs, [bottom.diff_id, missing.diff_id])
        with pytest.raises(layers.BuildError, match=f"{stage}.*lost.*did not load"):
            layers.load_images(client, [], [(stage_config, stage), (lost, f"raytrain-importtest-lost:{suffix}")])
    finally:
        for ref in (top, stage, tag, f"raytrain-importtest-lost:{suffix}"):
            try:
                client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass

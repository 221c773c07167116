"""The engine side of the directly assembled layers (toolchain/image/layers.py), on small images: layers loaded
in batches on a base (as the dependency layers are: toolchain/image/deps_stage.py) keep their diff IDs and run,
and an image whose layer neither the archive nor the engine has is refused."""
from __future__ import annotations

import hashlib
import uuid

import docker
import pytest
from helpers.small_image import runnable_base

from toolchain.image import layers


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


def _remove(client, *refs):
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_layers_loaded_in_two_batches_on_a_base_run(client, base, tmp_path):
    """The second load carries only its own layer: the engine has the chain below it from the first."""
    one = file_layer(tmp_path, [("opt/venv/one.txt", b"one\n", False)])
    two = file_layer(tmp_path, [("opt/venv/two.txt", b"two\n", False)])
    suffix = uuid.uuid4().hex[:8]
    first, second = f"raytrain-importtest-first:{suffix}", f"raytrain-importtest-second:{suffix}"
    base_attrs = client.images.get(base).attrs
    chain = base_attrs["RootFS"]["Layers"]
    try:
        c1 = layers.image_config(base_attrs, [*chain, one.diff_id])
        c2 = layers.image_config(base_attrs, [*chain, one.diff_id, two.diff_id])
        assert layers.load(client, [one], c1, first) == "sha256:" + hashlib.sha256(c1).hexdigest()
        sent = []
        layers.load(client, [two], c2, second, progress=sent.append)
        assert sent[-1] < one.size + two.size  # only the new layer travelled
        assert client.images.get(second).attrs["RootFS"]["Layers"] == [*chain, one.diff_id, two.diff_id]
        out = client.containers.run(second, ["/bin/cat", "/opt/venv/one.txt", "/opt/venv/two.txt"], remove=True)
        assert out == b"one\ntwo\n"
    finally:
        _remove(client, second, first)


def test_an_image_whose_layer_nobody_has_is_refused_naming_its_tags(client, base, tmp_path):
    base_attrs = client.images.get(base).attrs
    missing = file_layer(tmp_path, [("opt/missing", b"m", False)])
    lost = layers.image_config(base_attrs, [*base_attrs["RootFS"]["Layers"], missing.diff_id])
    tag = f"raytrain-importtest-lost:{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(layers.BuildError, match=f"{tag}.*did not load"):
            layers.load_images(client, [], [(lost, tag)])
    finally:
        _remove(client, tag)

"""The dependency layers in the engine and the registry (toolchain/image/deps_stage.py, toolchain/publish/push.py), on a
small runnable base standing in for the user stage: the layers load in order and the image runs; a wheel
removed leaves nothing behind; a changed wheel writes its own layer only; two projects that share a wheel
share its layer, and the second push mounts it from the first one's repository (a real docker-registry)."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import uuid
from concurrent.futures import Future
from pathlib import Path

import docker
import pytest
from helpers.small_image import PlainRegistry, cleanup_pulled, runnable_base
from test_venv_layer import make_wheel

from toolchain.image import venv_plan
from toolchain.image.deps_stage import DepsAssembly
from toolchain.image.venv_plan import LayerIndex
from toolchain.progress import Reporter
from toolchain.image.venv_layer import Python, wheels_of

PY = Python("3.11.2", "/usr/bin/python3", importlib.util.MAGIC_NUMBER.hex(), sys.implementation.cache_tag)
SITE = "/opt/venv/lib/python3.11/site-packages"


@pytest.fixture
def user(client):
    ref = f"raytrain-depstest-user:{uuid.uuid4().hex[:8]}"
    image_id = runnable_base(client, ref)
    made: list[str] = []
    yield ref, made
    for tag in made:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
    client.images.remove(image_id, force=True)


def assemble(client, user, wheelhouse: Path, store: Path) -> tuple[dict, DepsAssembly]:
    """The deps stage of the wheelhouse's wheels on the user stage, as the build assembles it."""
    ref, made = user
    wheels = wheels_of(wheelhouse, "3.11")
    sha = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    planned, _ = venv_plan.plan(wheels, sha, "/opt/venv", PY.minor, ["test"])
    job: Future = Future()
    job.set_result((ref, "key"))
    tag = f"raytrain-depstest-deps:{uuid.uuid4().hex[:12]}"
    made.append(tag)
    assembly = DepsAssembly(client, store, planned, PY, "/opt/venv", True, job, ref, tag, Reporter(quiet=True),
                            LayerIndex(store.parent / "index"))
    attrs, _ = assembly.run(tag)
    return attrs, assembly


def cat(client, image: str, *paths: str) -> str:
    return client.containers.run(image, ["/bin/cat", *paths], remove=True).decode()


def big(where: Path, dist: str, version: str, seed: int, scale: int = 1) -> Path:
    """A wheel past OWN_LAYER_BYTES (SCALE times): a layer of its own."""
    data = hashlib.sha256(str(seed).encode()).digest() * (scale * venv_plan.OWN_LAYER_BYTES // 32 + 1)
    return make_wheel(where, dist, version, {f"{dist}/__init__.py": f"V = '{version}'\n".encode(),
                                             f"{dist}/blob.bin": data})


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    big(wh, "heavy", "1.0", 1, scale=2)
    big(wh, "middle", "1.0", 2)
    make_wheel(wh, "tiny", "1.0", {"tiny.py": b"T = 1\n"}, entry_points="[console_scripts]\ntiny = tiny:main\n")
    return wh


def test_the_layers_load_in_order_and_the_image_runs(client, user, wheelhouse, tmp_path):
    attrs, assembly = assemble(client, user, wheelhouse, tmp_path / "store")
    ref, made = user
    chain = attrs["RootFS"]["Layers"]
    user_chain = client.images.get(ref).attrs["RootFS"]["Layers"]
    wheel_layers = [s.diff_id for s in assembly.slots]
    assert chain[:len(user_chain)] == user_chain and chain[len(user_chain):-1] == wheel_layers
    assert [s.planned.name for s in assembly.slots][:2] == ["heavy", "middle"]  # biggest first, groups above
    tag = sys.implementation.cache_tag
    out = cat(client, made[-1], f"{SITE}/heavy/__init__.py", f"{SITE}/tiny.py", "/opt/venv/bin/tiny",
              f"{SITE}/heavy/__pycache__/__init__.{tag}.pyc")
    assert out.startswith("V = '1.0'\nT = 1\n#!/opt/venv/bin/python\n")
    # no intermediate image of the batches is left behind, tagged or not
    assert not [i for i in client.images.list(all=True) for t in i.tags if t.endswith("-partial")]
    assert assembly.stats["written"] == 3


def test_a_wheel_removed_leaves_no_file_behind_and_a_change_writes_only_its_layer(client, user, wheelhouse, tmp_path):
    store = tmp_path / "store"
    first, _ = assemble(client, user, wheelhouse, store)
    (wheelhouse / "middle-1.0-py3-none-any.whl").unlink()
    second, again = assemble(client, user, wheelhouse, store)
    assert again.stats["written"] == 0  # heavy and tiny's group were at hand: only the top layer is new
    with pytest.raises(docker.errors.ContainerError):
        cat(client, user[1][-1], f"{SITE}/middle/__init__.py")
    assert cat(client, user[1][-1], f"{SITE}/heavy/__init__.py") == "V = '1.0'\n"
    # heavy's tar dropped (as the push drops it), then heavy changed: middle gone, heavy new, tiny's layer
    # above it loaded again from the store
    big(wheelhouse, "middle", "1.0", 2)
    for old in wheelhouse.glob("heavy-*"):
        old.unlink()
    big(wheelhouse, "heavy", "1.1", 3, scale=2)
    third, changed = assemble(client, user, wheelhouse, store)
    assert changed.stats["written"] == 1 and changed.stats["rewritten"] == 0
    assert third["RootFS"]["Layers"][-3] == first["RootFS"]["Layers"][-3]  # middle: the same layer as at first
    assert cat(client, user[1][-1], f"{SITE}/heavy/__init__.py") == "V = '1.1'\n"
    # a tar the push dropped is written again, byte for byte, when a chain above a change needs it
    (store / f"{first['RootFS']['Layers'][-3][7:]}.tar").unlink()  # middle's
    for old in wheelhouse.glob("heavy-*"):
        old.unlink()
    big(wheelhouse, "heavy", "1.2", 4, scale=2)
    _, rewritten = assemble(client, user, wheelhouse, store)
    assert rewritten.stats["rewritten"] == 1 and rewritten.slots[1].diff_id == first["RootFS"]["Layers"][-3]


def test_two_projects_share_a_wheel_s_layer_and_the_second_push_mounts_it(client, user, tmp_path, monkeypatch):
    """Two projects (other build directories, other wheel sets) with one wheel in common: the same layer
    digest, and the second project's push, told of no other repository, mounts it from the first's."""
    from toolchain.publish.push import push_image
    monkeypatch.setenv("RAYTRAIN_CACHE", str(tmp_path / "cache"))  # the shared digest and home indexes
    images = []
    for project, own in (("p1", "alpha"), ("p2", "beta")):
        wh = tmp_path / project / "wheelhouse"
        wh.mkdir(parents=True)
        big(wh, "shared", "2.0", 7)
        big(wh, own, "1.0", len(own))
        attrs, assembly = assemble(client, user, wh, tmp_path / project / "layers")
        images.append((project, attrs, {s.planned.name: s.diff_id for s in assembly.slots}))
    assert images[0][2]["shared"] == images[1][2]["shared"]
    reg = PlainRegistry(tmp_path / "reg")
    try:
        results = [push_image(client, "cpu", attrs["Id"], f"{reg.address}/{project}", ["a"], 0, 0.1,
                              Reporter(quiet=True), 30, layer_store=tmp_path / project / "layers",
                              blob_cache=tmp_path / project / "blobs", candidates=[user[0]])
                   for project, attrs, _ in images]
        assert results[1].layers_mounted >= 2  # the shared wheel's layer, and the user stage's
        assert results[1].bytes_uploaded < results[0].bytes_uploaded / 2
    finally:
        reg.stop()
        cleanup_pulled(client, reg.address)

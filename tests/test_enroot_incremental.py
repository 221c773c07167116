"""The incremental .sqsh (deploy/targets/pyxis/enroot_incremental.py) against a full conversion, on real Docker and
squashfs-tools: same entries, modes, owners, link targets, configuration files and file contents.

The lower image is the enroot fixture (tests/helpers/enroot_fixture.py: the cases enroot's import
handles specially); the upper layers are assembled with toolchain/image/layers.py, as the build does, and
kept in a layer store. The cpu image's incremental .sqsh is compared and booted in tests/test_enroot.py.
"""
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from deploy.targets.pyxis import enroot, enroot_incremental, sqsh
from helpers import enroot_fixture
from runtime.wait import wait_until
from toolchain.image import layers


def tree_digest(sqsh: Path, dest: Path) -> dict[str, str]:
    """path -> sha256 of every regular file's content, unpacked from the squashfs."""
    enroot_fixture.unsquash(sqsh, dest, "-n")
    out = {}
    for p in sorted(dest.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(dest))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def facts_without_time(path: Path) -> dict:
    return enroot_fixture.facts(str(path))


def stack(client, lower_tag: str, layer: layers.Layer, tag: str, store: Path, workdir: str | None = None) -> str:
    lower = client.images.get(lower_tag).attrs
    config = layers.image_config(lower, [*lower["RootFS"]["Layers"], layer.diff_id])
    if workdir:
        doc = json.loads(config)
        doc["config"]["WorkingDir"] = workdir
        config = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    layers.load(client, [layer], config, tag, store)
    return tag


def app_layer(train: bytes) -> layers.Layer:
    return layers.make_layer([("/app/project/train.py", train, False), ("/app/runtime/__init__.py", b"", False),
                              ("/app/project/run.sh", b"#!/bin/sh\necho run\n", True),
                              ("/etc/raytrain/cluster-spec.json", b'{"cluster_name": "x"}\n', False)])


@pytest.fixture(scope="module")
def fixture_image(client):
    tag = enroot_fixture.build(client)
    yield tag
    client.images.remove(tag, force=True)


@pytest.fixture
def store(tmp_path):
    return tmp_path / "layers"


@pytest.fixture
def made(client):
    tags = []
    yield tags
    for t in tags:
        client.images.remove(t, force=True)


@pytest.mark.parametrize("workdir,hot", [("/opt/ro", {"app", "etc"}),             # in the lower layers
                                         (None, {"app", "etc", "srv"}),            # /srv/app: not in any layer
                                         ("/work/dir", {"app", "etc", "work"})],   # a new top-level directory
                         ids=["workdir-in-lower", "workdir-under-lower-dir", "workdir-new"])
def test_incremental_equals_full_conversion(client, fixture_image, store, made, tmp_path, workdir, hot):
    tag = stack(client, fixture_image, app_layer(b"print('v1')\n"), "raytrain-incr-test:v1", store, workdir)
    made.append(tag)
    full = sqsh.convert(client, tag, tmp_path / "full")
    inc = sqsh.convert(client, tag, tmp_path / "inc", layer_store=store)
    assert (full.how, inc.how) == ("full", "incremental"), inc.note
    want, got = facts_without_time(full.path), facts_without_time(inc.path)
    assert got["superblock"] == want["superblock"]
    assert got["files"] == want["files"]
    assert got["listing"] == want["listing"]                       # modes, owners, link targets, the root
    assert "/app/project/run.sh" in got["listing"] and (workdir or "/srv/app") in got["listing"]
    assert tree_digest(inc.path, tmp_path / "t-inc") == tree_digest(full.path, tmp_path / "t-full")
    # the split: /etc, /app and the top of a WorkingDir the lower layers lack (enroot makes it) were
    # re-squashed; the rest, /opt (deep, odd modes) among it, came from the cache
    meta = enroot_incremental.LowerCache(inc.path.parent, enroot_incremental.cache_key(
        client.images.get(fixture_image).attrs["RootFS"]["Layers"], enroot.ENROOT_DEFAULT_OPTIONS)).meta
    assert set(meta["hot"]) == hot


def test_a_one_line_change_reuses_the_lower_cache(client, fixture_image, store, made, tmp_path):
    out = tmp_path / "sqsh"
    made.append(stack(client, fixture_image, app_layer(b"print('v1')\n"), "raytrain-incr-test:a", store))
    first = sqsh.convert(client, made[-1], out, layer_store=store)
    (cache,) = [p for p in (out / ".lower").iterdir() if not p.name.startswith(".")]
    base_inode = (cache / "base.sqsh").stat().st_ino
    wait_until(lambda: list(cache.glob("spare-*.sqsh")), timeout_s=60, what="the spare copy made in the background")
    made.append(stack(client, fixture_image, app_layer(b"print('v2')\n"), "raytrain-incr-test:b", store))
    said: list[str] = []
    second = sqsh.convert(client, made[-1], out, layer_store=store, progress=said.append)
    assert (first.how, second.how) == ("incremental", "incremental")
    assert (cache / "base.sqsh").stat().st_ino == base_inode       # not squashed again
    assert any("took the spare copy of" in s for s in said), said    # and not copied again either
    assert enroot_fixture.facts(str(second.path))["listing"] == enroot_fixture.facts(str(first.path))["listing"]
    assert enroot_fixture.read_member(str(second.path), "app/project/train.py") == "print('v2')\n"
    assert enroot_fixture.read_member(str(first.path), "app/project/train.py") == "print('v1')\n"
    again = sqsh.convert(client, made[-1], out, layer_store=store)
    assert again.how == "cached"


def test_a_layer_with_a_whiteout_falls_back_to_a_full_conversion(client, fixture_image, store, made, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("opt", None), ("opt/.wh.setuid", b""), ("app", None), ("app/x", b"x\n")):
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    layer = layers.Layer(buf.getvalue())
    made.append(stack(client, fixture_image, layer, "raytrain-incr-test:wh", store))
    res = sqsh.convert(client, made[-1], tmp_path / "wh", layer_store=store)
    assert res.how == "full" and "whiteout" in res.note and "opt/.wh.setuid" in res.note
    listing = enroot_fixture.listing(str(res.path))
    assert "/opt/setuid" not in listing and "/app/x" in listing  # the deletion happened, as the engine did it
    assert not (tmp_path / "wh" / ".lower").exists()              # nothing cached for a fallback


def test_an_image_built_elsewhere_falls_back_with_the_reason(client, fixture_image, tmp_path):
    res = sqsh.convert(client, fixture_image, tmp_path / "x", layer_store=tmp_path / "empty-store")
    assert res.how == "full" and "not in the layer store" in res.note


def test_a_store_file_that_does_not_hash_to_its_name_is_not_trusted(client, fixture_image, store, made, tmp_path):
    layer = app_layer(b"print('v1')\n")
    made.append(stack(client, fixture_image, layer, "raytrain-incr-test:bad", store))
    (store / f"{layer.diff_id[7:]}.tar").write_bytes(layer.data.replace(b"print('v1')", b"print('XX')"))
    res = sqsh.convert(client, made[-1], tmp_path / "bad", layer_store=store)
    assert res.how == "full"
    assert enroot_fixture.read_member(str(res.path), "app/project/train.py") == "print('v1')\n"


def test_big_writes_ask_for_free_space_and_partials_do_not_outlive_their_copier(tmp_path):
    """On a small real filesystem (a 64 MiB tmpfs) the spare copy is skipped with the numbers and a
    required copy is refused before it starts; on the big one the spare is made. A `.spare.<pid>.partial`
    whose copier is gone is removed; one whose copier runs is left alone."""
    import os
    import subprocess
    import time

    from deploy.targets.pyxis import diskspace
    from deploy.job import DeployError

    def cache_in(root):
        cache = enroot_incremental.LowerCache(root, "k" * 16)
        cache.dir.mkdir(parents=True)
        (cache.dir / "base.sqsh").write_bytes(os.urandom(1 << 20) * 8)  # 8 MiB
        return cache, {"build_id": "b1"}

    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        cache, meta = cache_in(small)
        with pytest.raises(enroot_incremental.NoRoom, match=r"no spare copy for the next change: it needs 8 MiB and 2.0 GiB left free"):
            enroot_incremental.prepare_spare(cache, meta)
        with pytest.raises(DeployError, match=r"copying the cached squashfs to append to needs .* is free\. Free some space"):
            enroot_incremental._take_base_copy(cache, meta, small / "out.sqsh")
        assert sorted(p.name for p in small.rglob("*") if p.is_file()) == ["base.sqsh"]
    finally:
        subprocess.run(["umount", str(small)])

    cache, meta = cache_in(tmp_path / "big")
    assert diskspace.room(cache.dir, 8 << 20)
    stale = cache.dir / ".spare.999999999.partial"
    live = cache.dir / f".spare.{os.getpid()}.partial"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    assert enroot_incremental.prepare_spare(cache, meta)
    deadline = time.monotonic() + 30
    while not enroot_incremental._spare(cache, meta).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert enroot_incremental._spare(cache, meta).read_bytes() == (cache.dir / "base.sqsh").read_bytes()
    assert not stale.exists() and live.exists()

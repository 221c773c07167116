"""Reproducible images: the same sources give the same image ID from any checkout path and any
mtimes, and the same pushed digest; assembled layers are only files, sorted,
with fixed metadata."""
import os
import shutil
import tarfile
import io


from conftest import SPEC, make_settings
from toolchain.image import layers
from toolchain import pipeline
from toolchain.progress import Reporter


def clone(src, dst, mtime):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, _, files in os.walk(dst):
        for f in files:
            os.utime(os.path.join(dirpath, f), (mtime, mtime))
    return dst


def test_layer_bytes_do_not_depend_on_path_or_mtime(tmp_path, app_dir):
    a = clone(app_dir, tmp_path / "a" / "deep" / "path", 1_000_000)
    b = clone(app_dir, tmp_path / "b", 2_000_000_000)
    la, lb = (layers.make_layer(layers.files_under(p, "/opt/app/project")) for p in (a, b))
    assert la.data == lb.data and la.diff_id == lb.diff_id
    with tarfile.open(fileobj=io.BytesIO(la.data)) as tf:
        members = tf.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members} <= {0o755, 0o644}
    (b / "train.py").write_text((b / "train.py").read_text() + "# changed\n")
    assert layers.make_layer(layers.files_under(b, "/opt/app/project")).diff_id != la.diff_id


def test_two_clones_give_the_same_image_and_digest(client, built, pushed, registry, settings, tmp_path, app_dir):
    """Each clone, built in a build directory of its own, pushes the session's manifest digest: the manifest
    is made from the clone's own build record. (The registry has the blobs, so none is compressed again:
    that compressing gives the same bytes is test_blobs' `test_same_input_same_bytes_whatever_the_worker_count`,
    and a push to an empty registry is the session's own.)"""
    ids, digests = [], []
    for i, mtime in enumerate((1_000_000, 2_000_000_000)):
        root = tmp_path / f"clone{i}" / ("x" * (i + 1))
        app = clone(app_dir, root / "app", mtime)
        runtime = clone(app_dir.parent / "runtime", root / "runtime", mtime)
        s = make_settings(tmp_path / f"work{i}", app, registry_address=settings.registry.address, runtime_dir=runtime)
        s.registry.data_dir = settings.registry.data_dir
        ids.append(pipeline.build(s, str(SPEC), "cpu", Reporter(quiet=True))["images"]["cpu"]["image_id"])
        out = pipeline.push(s, str(SPEC), "cpu", Reporter(quiet=True))
        digests.append(out["images"]["cpu"]["digest"])
    assert ids[0] == ids[1] == built["cpu"]["image_id"]
    assert digests[0] == digests[1] == pushed["cpu"]["digest"]

"""Reproducible images: the same sources give the same image ID from any checkout path and any
mtimes, and the same pushed digest in a fresh registry; assembled layers are only files, sorted,
with fixed metadata."""
import os
import shutil
import tarfile
import io


from conftest import SPEC, make_settings
from toolchain import layers, pipeline
from toolchain.progress import Reporter
from toolchain.registry import start_local, stop_local


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
    ids = []
    for i, mtime in enumerate((1_000_000, 2_000_000_000)):
        root = tmp_path / f"clone{i}" / ("x" * (i + 1))
        app = clone(app_dir, root / "app", mtime)
        runtime = clone(app_dir.parent / "runtime", root / "runtime", mtime)
        s = make_settings(tmp_path / f"work{i}", app, registry_address=settings.registry.address, runtime_dir=runtime)
        ids.append(pipeline.build(s, str(SPEC), "cpu", Reporter(quiet=True))["images"]["cpu"]["image_id"])
    assert ids[0] == ids[1] == built["cpu"]["image_id"]
    # a fresh registry, on another port: the pushed digest is the one recorded in the session's push
    fresh = make_settings(tmp_path / "fresh", app_dir, registry_address="127.0.0.1:5077")
    fresh.registry.data_dir = str(tmp_path / "fresh-registry")
    shutil.copy(settings.build_dir / "build.json", fresh.build_dir / "build.json")
    start_local(fresh, Reporter(quiet=True))
    try:
        again = pipeline.push(fresh, str(SPEC), "cpu", Reporter(quiet=True))["images"]["cpu"]
        assert again["digest"] == pushed["cpu"]["digest"]
    finally:
        stop_local(fresh)

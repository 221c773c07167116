"""The build cache works as users expect: a code change rebuilds app+spec, a spec change only spec,
and a re-push uploads only the changed layers."""
import json
import shutil
import uuid

import pytest

from conftest import SPEC, make_settings, run_in
from toolchain import pipeline
from toolchain.progress import Reporter


def layers(client, ref):
    return client.images.get(ref).attrs["RootFS"]["Layers"]


@pytest.fixture
def edited_project(tmp_path, app_dir, settings):
    app = tmp_path / "app"
    shutil.copytree(app_dir, app)
    s = make_settings(tmp_path / "work", app, registry_address=settings.registry.address,
                      runtime_dir=app_dir.parent / "runtime")
    s.registry.data_dir = settings.registry.data_dir
    return s, app


def test_one_line_code_change_rebuilds_and_pushes_only_top_layers(client, built, registry, settings, edited_project):
    s, app = edited_project
    first = pipeline.build(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    assert first["local_ref"] == built["cpu"]["local_ref"] and first["rebuilt"] == []
    pipeline.push(s, str(SPEC), "cpu", Reporter())  # the old image is in the registry (maybe pushed earlier)

    train = app / "train.py"
    marker = f"# one-line change {uuid.uuid4().hex}"  # unique: content-keyed stages persist across runs
    train.write_text(train.read_text() + marker + "\n")
    second = pipeline.build(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    assert second["rebuilt"] == ["app", "spec"]
    assert second["deps_ref"] == first["deps_ref"] and second["local_ref"] != first["local_ref"]

    old, new = layers(client, first["local_ref"]), layers(client, second["local_ref"])
    deps_layers = layers(client, first["deps_ref"])
    assert new[: len(deps_layers)] == old[: len(deps_layers)] == deps_layers
    changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert changed and min(changed) >= len(deps_layers)

    push2 = pipeline.push(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]["push"]
    assert push2["layers_pushed"] <= len(new) - len(deps_layers)
    assert push2["layers_existing"] >= len(deps_layers)
    assert 0 < push2["bytes_uploaded"] < 1_000_000 < client.images.get(second["local_ref"]).attrs["Size"] // 1000
    got = run_in(client, second["local_ref"], ["grep", "-c", f"^{marker}$", "/app/project/train.py"])
    assert got.strip() == "1"


def test_spec_change_rebuilds_only_spec_layer(client, built, edited_project, tmp_path):
    s, _ = edited_project
    spec2 = tmp_path / "spec2.json"
    data = json.loads(SPEC.read_text())
    data["cluster_name"] = f"renamed-{uuid.uuid4().hex[:8]}"
    spec2.write_text(json.dumps(data))
    out = pipeline.build(s, str(spec2), "cpu", Reporter())["images"]["cpu"]
    assert out["rebuilt"] == ["spec"]
    assert out["app_ref"] == built["cpu"]["app_ref"]
    old, new = layers(client, built["cpu"]["local_ref"]), layers(client, out["local_ref"])
    assert old[:-1] == new[:-1] and old[-1] != new[-1]
    got = run_in(client, out["local_ref"], ["sh", "-c", 'cat "$CLUSTER_SPEC_PATH"; echo "<END>"'])
    assert got.encode() == spec2.read_bytes() + b"<END>\n"


def test_the_assembled_layers_are_kept_in_the_layer_store(client, built, edited_project):
    """The app and spec layers as tars named by diff ID (what the incremental .sqsh appends), also
    when the stages are reused from the engine: made again from the same files, same bytes."""
    import hashlib

    from toolchain.image.images import LAYER_STORE
    s, _ = edited_project  # a fresh build dir: every stage is reused, the store starts empty
    out = pipeline.build(s, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    store = s.build_dir / LAYER_STORE
    for diff_id in layers(client, out["local_ref"])[-2:]:
        kept = store / f"{diff_id[7:]}.tar"
        assert "sha256:" + hashlib.sha256(kept.read_bytes()).hexdigest() == diff_id
    # and the configs of the two assembled images, the exact bytes whose sha256 is the image ID (the push sends them)
    configs = [client.images.get(ref).id for ref in (out["app_ref"], out["local_ref"])]
    for image_id in configs:
        assert "sha256:" + hashlib.sha256((store / f"{image_id[7:]}.json").read_bytes()).hexdigest() == image_id
    # nothing else: no partial files, no venv or deps layer (a reused stage's are in the engine)
    assert len(list(store.iterdir())) == 4


def test_the_pushed_image_s_lower_layers_are_those_the_sqsh_cache_is_keyed_on(client, built, pushed, settings):
    """The incremental .sqsh (deploy/targets/pyxis/enroot_incremental.py) caches the chain below the app
    layer, keyed on its diff IDs, and finds it in a local image: for the image as pushed (resolved by
    its digest, as `deploy --sqsh` names it) that chain is the deps stage's, which the engine has."""
    from deploy.targets.pyxis import enroot_incremental as inc
    from toolchain.image.images import LAYER_STORE
    from toolchain.records import read_pushes
    ref = read_pushes(settings.build_dir)["cpu"].repo_digest.docker()
    chain = client.images.get(ref).attrs["RootFS"]["Layers"]
    sp = inc.split(chain, settings.build_dir / LAYER_STORE)
    assert sp.lower_chain == layers(client, built["cpu"]["deps_ref"])
    assert len(sp.upper) == 2 and sp.tops == {"app", "etc"}  # the app and the spec layers
    assert inc._find_image_with_chain(client, sp.lower_chain) == client.images.get(built["cpu"]["deps_ref"]).id

"""toolchain/records.py's BuildRecord: the images a build stood on are values (runtime/imageref.py ImageRef),
parsed once when build/build.json is read, written back as their text; a build with no engine must name a
base pinned in the registry, or the file is refused with the fix."""
from __future__ import annotations

import json

import pytest

from runtime.errors import InputError
from runtime.imageref import ImageRef
from toolchain.records import read_builds, write_builds

ID = "sha256:" + "1" * 64
PINNED = "127.0.0.1:5000/proj-base@sha256:" + "2" * 64


def _record(**over) -> dict:
    return {"variant": "cpu", "local_ref": "proj-cpu:cpu-0123", "human_ref": "proj-cpu:cpu-latest", "image_id": ID,
            "spec_sha256": "3" * 64, "torch_source": "pypi", **over}


def _write(tmp_path, record: dict) -> None:
    (tmp_path / "build.json").write_text(json.dumps({"cpu": record}))


def test_an_engine_builds_stages_are_refs_and_a_registry_builds_none(tmp_path):
    _write(tmp_path, _record(base_ref="proj-base:abc", user_ref="proj-stages:user-1", deps_ref="proj-stages:deps-1",
                             app_ref="proj-stages:app-1"))
    engine = read_builds(tmp_path)["cpu"]
    assert engine.stages() == [ImageRef.parse("proj-base:abc"), ImageRef.parse("proj-stages:user-1"),
                               ImageRef.parse("proj-stages:deps-1")]
    # as an earlier version wrote a registry build: "" and "-" where it had no stage
    _write(tmp_path, _record(base_ref=PINNED, user_ref="", deps_ref="-", app_ref="-", engine=False))
    registry = read_builds(tmp_path)["cpu"]
    assert registry.stages() == [ImageRef.parse(PINNED)] and registry.base_ref.pinned
    assert registry.user_ref is None and registry.deps_ref is None and registry.app_ref is None

    write_builds(tmp_path, [registry])  # written back as text, null where there is none
    saved = json.loads((tmp_path / "build.json").read_text())["cpu"]
    assert (saved["base_ref"], saved["user_ref"], saved["deps_ref"]) == (PINNED, None, None)
    assert read_builds(tmp_path)["cpu"] == registry


@pytest.mark.parametrize("base", ["proj-base:abc", None, "-", "not a ref!"])
def test_a_registry_build_without_a_pinned_base_is_refused_with_the_fix(tmp_path, base):
    _write(tmp_path, _record(base_ref=base, engine=False))
    with pytest.raises(InputError, match=r"build\.json is malformed \(.*base_ref.*\); it is written by `.*build`: "
                                         r"delete it and run"):
        read_builds(tmp_path)

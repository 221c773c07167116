"""Cluster spec model: the seed format loads unchanged; bad specs name field, value and fix."""
import json
import re
from pathlib import Path

import jsonschema
import pytest

from runtime.spec import SpecError, json_schema, load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "cluster_specs").glob("*.json"))
EXAMPLES = [p for p in EXAMPLES if p.name != "schema.json"]

# The seed document's format, field for field (ReaL's cluster_config.json).
SEED = {
    "cluster_type": "slurm",
    "cluster_name": "my_cluster",
    "fileroot": "/storage/ray",
    "default_mount": "/storage:/storage",
    "node_type_from_node_name": {"slurmd-\\d+$": "g8"},
    "gpu_type_from_node_name": {"slurmd-\\d+$": "tesla"},
    "cpu_image": "real-cpu:22.04-0.1.0",
    "gpu_image": "real-gpu:23.10-py3-0.1.0",
    "node_name_prefix": "slurmd-",
}


def test_seed_format_loads_verbatim():
    spec = parse_spec(SEED)
    assert spec.node_type("slurmd-12") == "g8"
    assert spec.gpu_type("slurmd-3") == "tesla"
    assert spec.node_type("login-1") is None
    assert [m.as_string() for m in spec.mounts] == ["/storage:/storage"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_match_schema(path):
    load_spec(path)
    jsonschema.validate(json.loads(path.read_text()), json_schema())


def test_at_least_three_example_targets():
    types = {json.loads(p.read_text())["cluster_type"] for p in EXAMPLES}
    pyxis = [p for p in EXAMPLES if json.loads(p.read_text()).get("slurm", {}).get("pyxis")]
    assert {"slurm", "kubernetes"} <= types and pyxis


def test_committed_schema_is_current():
    committed = json.loads((ROOT / "cluster_specs" / "schema.json").read_text())
    assert committed == json_schema(), "run `invoke spec.schema` and commit cluster_specs/schema.json"


def problems(data):
    with pytest.raises(SpecError) as e:
        parse_spec(data, "t.json")
    return e.value.problems


@pytest.mark.parametrize("change,field,words", [
    ({"cluster_name": 7}, "cluster_name", ["valid string", "got 7"]),
    ({"cluster_type": "pbs"}, "cluster_type", ["'slurm'", "got \"pbs\""]),
    ({"fileroot": "data/exp"}, "fileroot", ["absolute", "data/exp"]),
    ({"default_mount": "/a"}, "default_mount", ["/src:/dst", "'/a'"]),
    ({"node_type_from_node_name": {"slurmd-(\\d+": "g8"}}, "node_type_from_node_name", ["regular expression", "slurmd-(\\\\d+"]),
    ({"gpu_type_from_node_name": {"[a-": "x"}}, "gpu_type_from_node_name", ["regular expression"]),
    ({"slurm": {"pyxis": "maybe"}}, "slurm.pyxis", ["boolean", "true or false"]),
    ({"kubernetes": {"namespace": "Bad_NS"}}, "kubernetes.namespace", ["Bad_NS", "DNS-1123 label"]),
])
def test_bad_values_name_field_value_and_fix(change, field, words):
    out = problems({**SEED, **change})
    line = next(l for l in out if l.startswith(field + ":"))
    for w in words:
        assert w in line, (w, line)


def test_unknown_keys_get_did_you_mean():
    out = problems({**SEED, "fileroots": "/x", "slurm": {"partiton": "gpu"}})
    assert "fileroots: unknown key; did you mean 'fileroot'?" in out
    assert "slurm.partiton: unknown key; did you mean 'partition'?" in out


def test_missing_required_fields_all_listed():
    out = problems({"cluster_type": "slurm"})
    for f in ("cluster_name", "fileroot", "cpu_image", "gpu_image"):
        assert f"{f}: Field required; add this field" in out


def test_kubernetes_needs_its_section():
    out = problems({**SEED, "cluster_type": "kubernetes"})
    assert any("needs a 'kubernetes' section" in l for l in out)


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "s.json"
    bad.write_text("{ nope")
    with pytest.raises(SpecError, match="not valid JSON at line 1"):
        load_spec(bad)
    with pytest.raises(SpecError, match="cannot read the file"):
        load_spec(tmp_path / "absent.json")


@pytest.mark.parametrize("field,value,said", [
    ("cluster_name", "a\u2028b", "LINE SEPARATOR"), ("cluster_name", "a\u2029b", "PARAGRAPH SEPARATOR"),
    ("cluster_name", "evil\u202etxt", "RIGHT-TO-LEFT OVERRIDE"), ("cluster_name", "\u200b", "ZERO WIDTH SPACE"),
    ("cluster_name", " ", "cluster_name"), ("cluster_name", " padded", "cluster_name"),
    ("node_name_prefix", "n" * 300, "node_name_prefix"), ("fileroot", "/" + "f" * 5000, "at most 4096"),
    ("cpu_image", "a" * 5000, "at most 4096"),
])
def test_spec_text_is_plain_and_bounded(field, value, said):
    from runtime.spec import SpecError, parse_spec
    base = {"cluster_type": "local", "cluster_name": "c", "fileroot": "/f", "cpu_image": "a", "gpu_image": "b"}
    with pytest.raises(SpecError, match=re.escape(said)):
        parse_spec({**base, field: value})


def test_spec_sections_and_counts_are_bounded():
    from runtime.spec import SpecError, parse_spec
    base = {"cluster_type": "slurm", "cluster_name": "c", "fileroot": "/f", "cpu_image": "a", "gpu_image": "b"}
    for section, message in (({"env_setup": ["module load x\u0000"]}, r"U\+0000"), ({"gpus_per_node": 10**30}, "1024"),
                             ({"env_setup": ["x"] * 1001}, "at most 1000")):
        with pytest.raises(SpecError, match=message):
            parse_spec({**base, "slurm": section})
    with pytest.raises(SpecError, match="at most 1000"):
        parse_spec({**base, "node_type_from_node_name": {f"n{i}": "t" for i in range(1001)}})


def test_a_read_spec_is_one_version_of_the_file_whatever_happens_to_the_file(tmp_path):
    """read_spec reads the file once: its hash and its model are of the bytes it holds (what the build
    bakes in), and an edit after the read changes none of them; the next read sees the edit."""
    import hashlib
    import json
    from runtime.spec import read_spec, spec_hash
    src = Path(__file__).resolve().parents[1] / "cluster_specs" / "local.json"
    path = tmp_path / "spec.json"
    path.write_bytes(src.read_bytes())
    first = read_spec(path)
    assert first.raw == src.read_bytes() and first.sha256 == hashlib.sha256(first.raw).hexdigest()
    assert first.path == path and json.loads(first.raw)["cluster_name"] == first.model.cluster_name
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "cluster_name": "x" * len(doc["cluster_name"])}))
    assert first.model.cluster_name == doc["cluster_name"] and first.raw == src.read_bytes()
    again = read_spec(path)
    assert again.model.cluster_name == "x" * len(doc["cluster_name"])
    assert spec_hash(path) == again.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() != first.sha256

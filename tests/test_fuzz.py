"""Property-based fuzzing of every input boundary: the spec loader, image references, the scheduler
variables, the deploy flags and each renderer. Whatever comes in, the outcome is a value or the
project's InputError (exit 2, naming the field) in bounded time; never another exception, and a
failed deploy writes nothing."""
import json
from collections import Counter
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st

from deploy.targets import TARGETS, check_handle
from helpers import jobs
from runtime.errors import InputError
from runtime.cluster.identity import detect
from runtime.imageref import ImageRef
from runtime.spec import SpecError, load_spec, parse_spec, spec_hash
from toolchain import pipeline
from toolchain.progress import Reporter

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
OUTCOMES: dict = {k: Counter() for k in ("deploy flags", "renderers", "spec loader", "image references", "scheduler variables",
                                           "identity addresses", "held records")}  # each property's examples, by outcome
ACCEPTED_SHARE = 0.1  # of a property's examples, at least this share gets past the refusal to the property's check (20-40% measured)
RENDERED_SHARE = 0.1  # of a property's examples, at least this share reaches the render check (0.13 to 0.3 seen over seeds: 19 of 150 the lowest)
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
HOSTILE = st.sampled_from(["; rm -rf /", "$(touch /tmp/pwned)", "`id`", "a'b\"c", "x\ny", "\x00", "%j", "é€",
                           "(a+)+$", "9" * 5000, "-", "", " ", "*", "&a", "{{x}}", "\\", ":", ",", "/"])
TEXT = st.one_of(st.text(max_size=40), HOSTILE)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(TEXT, c, max_size=4), max_leaves=20)
VALID = json.loads((SPECS / "slurm-pyxis.json").read_text())

ADDRESSED = [  # a valid environment per source, and the variables in it that carry an address or a name
    ({"RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "2", "RAYTRAIN_HEAD_ADDRESS": "10.0.0.1", "HOSTNAME": "n1"},
     ("RAYTRAIN_HEAD_ADDRESS", "HOSTNAME")),
    ({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "HOSTNAME": "n1"},
     ("SKYPILOT_NODE_IPS",)),
    ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1"},
     ("SLURM_JOB_NODELIST", "SLURMD_NODENAME")),
    ({"KUBERNETES_SERVICE_HOST": "k", "JOB_COMPLETION_INDEX": "1", "RAYTRAIN_HEAD_ADDRESS": "job-head",
      "RAYTRAIN_NUM_NODES": "2", "HOSTNAME": "job-1", "RAYTRAIN_NODE_NAME": "node-a"},
     ("RAYTRAIN_HEAD_ADDRESS", "RAYTRAIN_NODE_NAME", "HOSTNAME")),
]


def bounded(fn, *args, limit_s=2.0):
    t0 = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - t0 < limit_s, f"{fn.__name__} took {time.monotonic() - t0:.1f}s"


@FUZZ
@given(st.lists(st.sampled_from(sorted(VALID) + ["$schema", "extra"]).flatmap(
    lambda k: st.tuples(st.just(k), st.one_of(JSONISH, st.just(VALID.get(k, "./schema.json"))))), max_size=3))
def _spec_loader_takes_anything(changes):
    merged = {**VALID, **dict(changes)}  # a few fields set to anything, or left as they were
    try:
        spec = bounded(parse_spec, merged)
    except SpecError as e:
        assert e.exit_code == 2 and e.problems and all(":" in p for p in e.problems)
        OUTCOMES["spec loader"]["refused"] += 1
        return
    OUTCOMES["spec loader"]["accepted"] += 1
    for pattern in spec.node_type_from_node_name:  # matching is bounded too (RE2)
        bounded(spec.node_type, "a" * 5000 + "!")


def test_spec_loader_takes_anything():
    _share("spec loader", _spec_loader_takes_anything)


@FUZZ
@given(st.binary(max_size=300))
def test_spec_files_of_any_bytes(tmp_path, raw):
    f = tmp_path / "spec.json"
    f.write_bytes(raw)
    with pytest.raises(SpecError):
        bounded(load_spec, f)


def test_spec_file_edge_cases(tmp_path):
    import os
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    big_int = tmp_path / "int.json"
    big_int.write_text('{"cluster_type": ' + "9" * 5000 + "}")
    for path, needle in ((fifo, "not a regular file"), (deep, "usable JSON"), (big_int, "usable JSON"),
                         (tmp_path / "missing.json", "cannot read")):
        with pytest.raises(SpecError, match=needle):
            bounded(load_spec, path)
    schema_ok = {**VALID, "$schema": "./schema.json"}
    assert parse_spec(schema_ok).cluster_name == VALID["cluster_name"]


@pytest.mark.parametrize("pattern", ["(a+)+$", r"gpu-node-(\d+)+$", "(x|x)*y", "a{1000}"])
def test_backtracking_patterns_match_in_linear_time(pattern):
    spec = parse_spec({**VALID, "node_type_from_node_name": {pattern: "g8"}})
    bounded(spec.node_type, "a" * 50000 + "!", limit_s=0.5)
    bounded(spec.node_type, "gpu-node-" + "1" * 50000 + "x", limit_s=0.5)


@FUZZ
@given(st.one_of(TEXT, st.from_regex(r"[a-z0-9.:\[\]/@_-]{1,80}", fullmatch=True)))
def _image_references(text):
    try:
        ref = bounded(ImageRef.parse, text)
    except InputError:
        OUTCOMES["image references"]["refused"] += 1
        return
    OUTCOMES["image references"]["accepted"] += 1
    assert ImageRef.parse(ref.docker()) == ref
    if ref.pinned:
        assert "\n" not in ref.pyxis() and " " not in ref.sqsh_name()


def test_image_references():
    _share("image references", _image_references)


SCHED_KEYS = ["SLURM_JOB_ID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NNODES",
              "SLURM_GPUS_ON_NODE", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES",
              "SKYPILOT_NUM_GPUS_PER_NODE", "DSTACK_NODE_RANK", "DSTACK_NODES_IPS", "KUBERNETES_SERVICE_HOST",
              "JOB_COMPLETION_INDEX", "HOSTNAME", "RAYTRAIN_NODE_RANK", "RAYTRAIN_NUM_NODES", "RAYTRAIN_HEAD_ADDRESS",
              "RAYTRAIN_NODE_RANK_OFFSET", "RAYTRAIN_GPUS_PER_NODE"]
SCHED_VALUES = st.one_of(TEXT, st.sampled_from(["0", "1", "2", "3", "n[1-3]", "a-[3-1]", "gpu-[01-99999999]",
                                               "gpu:a100:4(IDX:0-3)", "10.0.0.1 10.0.0.2", "gpu:" * 2000 + "8",
                                               "n[1-3],gpu-[08-10,12]", "[[[", "99999999999"]))


@FUZZ
@given(st.sampled_from([e for e, _ in ADDRESSED]), st.dictionaries(st.sampled_from(SCHED_KEYS), SCHED_VALUES, max_size=3))
def _scheduler_variables(valid, changed):
    env = {**valid, **changed}  # a valid environment, some of its variables and others set to anything
    try:
        ident = bounded(detect, env)
    except InputError:
        OUTCOMES["scheduler variables"]["refused"] += 1
        return
    OUTCOMES["scheduler variables"]["accepted"] += 1
    assert 0 <= ident.node_rank < ident.num_nodes


def test_scheduler_variables():
    _share("scheduler variables", _scheduler_variables)


def test_scheduler_variables_that_used_to_break():
    for env, needle in (({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "a-[3-1]"}, "cannot be read"),
                        ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu-[01-99999999]"},
                         "cannot be read"),
                        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "5", "SKYPILOT_NODE_IPS": "a\nb\nc"},
                         "lists 3 address")):
        with pytest.raises(InputError, match=needle):
            bounded(detect, env)
    env = {"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "gpu:" * 20000 + "8"}
    with pytest.raises(InputError):
        bounded(detect, env, limit_s=0.5)


@pytest.fixture
def project(tmp_path):
    from conftest import make_settings
    s = make_settings(tmp_path / "proj", ROOT / "examples" / "train")
    return s


def record(settings, spec_name, profile: str = "default"):
    sha = spec_hash(SPECS / spec_name)
    (settings.build_dir / "images.json").write_text(json.dumps({v: {
        "repo_digest": f"registry.example.com:5000/raytrain-{v}@sha256:" + "1" * 64, "spec_sha256": sha,
        "registry": "registry.example.com:5000", "registry_scheme": "https", "user": "1000:1000",
        "local_ref": f"raytrain-{v}:x", "image_id": "sha256:" + "2" * 64, "digest": "sha256:" + "1" * 64,
        "profile": profile} for v in ("cpu", "gpu")}))


SPEC_FOR = {"local": "local.json", "slurm": "slurm.json", "pyxis": "slurm-pyxis.json", "k8s": "kubernetes.json",
            "skypilot": "kubernetes.json"}
GOOD_FLAGS = {"seeds": "1-3", "slots": "node1:0,node2", "partition": "debug", "account": "ml", "port_stride": 100,
              "sqsh": True, "sqsh_to_fileroot": True, "allow_local_registry": True, "accelerator": "A100",
              "fileroot_store": "s3://b/x", "bogus": True}
FLAG = st.one_of(st.none(), TEXT, st.integers(-5, 10**6), st.booleans())


@FUZZ
@given(target=st.sampled_from(sorted(SPEC_FOR)),
       # weighted so that a stated share of the examples is valid and reaches the render check (RENDERED_SHARE)
       name=st.one_of(st.none(), st.just("ok-job"), st.just("ok-job"), st.just("a" * 60), TEXT),
       nodes=st.one_of(st.none(), st.integers(1, 8), st.integers(1, 8), st.integers(-1, 5000)),
       gpus=st.one_of(st.none(), st.none(), st.just(0), st.integers(-1, 100)),
       good=st.one_of(st.just([]), st.just([]), st.lists(st.sampled_from(sorted(GOOD_FLAGS)), max_size=2)),
       flags=st.one_of(st.just({}), st.just({}), st.dictionaries(st.sampled_from(sorted(GOOD_FLAGS)), FLAG, max_size=2)))
def _deploy_flags(project, tmp_path, target, name, nodes, gpus, good, flags):
    flags = {**{k: GOOD_FLAGS[k] for k in good}, **{k: v for k, v in flags.items() if v is not None}}
    record(project, SPEC_FOR[target], "skypilot" if target == "skypilot" else "default")  # SkyPilot needs its profile
    out = tmp_path / f"out-{target}"
    shutil.rmtree(out, ignore_errors=True)
    try:
        res = bounded(lambda: pipeline.deploy(project, str(SPECS / SPEC_FOR[target]), target, rep=Reporter(quiet=True),
                                              dry_run=target == "local" or bool(flags.get("sqsh")), name=name,
                                              nodes=nodes, gpus=gpus, out=str(out), **flags), limit_s=5)
    except InputError as e:
        event("refused")
        OUTCOMES["deploy flags"]["refused"] += 1
        assert str(e) and e.exit_code == 2
        assert not out.exists(), "a failed deploy wrote files"
        return
    event("rendered")
    OUTCOMES["deploy flags"]["rendered"] += 1
    assert res.target == target


def _share(kind: str, run, outcome: str = "accepted", share: float = ACCEPTED_SHARE) -> None:
    """Run the property over its examples, then check that enough of them got past the boundary to the
    property's check: a fuzz test whose every example is refused early checks nothing beyond the refusal."""
    OUTCOMES[kind].clear()
    run()
    seen = OUTCOMES[kind]
    assert sum(seen.values()) >= 50 and seen[outcome] >= share * sum(seen.values()), dict(seen)


def _share_rendered(kind: str, run) -> None:
    _share(kind, run, "rendered", RENDERED_SHARE)


def test_deploy_flags(project, tmp_path):
    _share_rendered("deploy flags", lambda: _deploy_flags(project, tmp_path))


JOB_VALUES = st.fixed_dictionaries({
    "env": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), TEXT, max_size=4),
    "command": st.lists(TEXT, min_size=1, max_size=5),
    "mount_source": st.one_of(TEXT, st.just("/data/x")),
})


@FUZZ
@given(values=JOB_VALUES, target=st.sampled_from(["slurm", "pyxis", "k8s", "skypilot"]))
def _renderers_keep_hostile_values_as_data(tmp_path, values, target):
    from runtime.spec import Mount
    try:
        job = jobs.job(env=values["env"], command=values["command"], workdir="/opt/app/project",
                       mounts=[Mount(source="/" + values["mount_source"].lstrip("/"), target="/mnt/x")])
    except (InputError, ValueError):
        OUTCOMES["renderers"]["refused"] += 1
        return  # refused at the boundary (NUL, bad names): fine
    spec = json.loads((SPECS / SPEC_FOR[target]).read_text())
    from runtime.spec import parse_spec as ps
    t = TARGETS[target]
    opts = t.parse_options({"allow_local_registry": True} if target in ("k8s", "skypilot") else {})
    try:
        art = t.render(job, ps(spec), opts)
    except InputError:
        event("refused at render")
        OUTCOMES["renderers"]["refused"] += 1
        return
    event("rendered")
    OUTCOMES["renderers"]["rendered"] += 1
    for name, f in art.files.items():
        if name.endswith(".sbatch"):
            p = tmp_path / "s.sbatch"
            p.write_text(f.text)
            assert subprocess.run(["bash", "-n", str(p)], capture_output=True).returncode == 0, f.text
        else:
            docs = list(yaml.safe_load_all(f.text))
            assert docs == (art.objects if target == "k8s" else [o for o in art.objects if o["name"] + ".yaml" == name])


def test_renderers_keep_hostile_values_as_data(tmp_path):
    _share_rendered("renderers", lambda: _renderers_keep_hostile_values_as_data(tmp_path))


# a value of the shape a name, an address or a path has, with some of the characters that break them
PLAUSIBLE = st.from_regex(r"[a-z0-9/][a-z0-9./_-]{0,20}[a-z0-9]?[ ,;\n-]?", fullmatch=True)
SAFE_ARG = re.compile(r"[^-\s,\x00-\x1f\x7f][^\s,\x00-\x1f\x7f]*")  # what may reach a tool's argv as one value




@FUZZ
@given(st.sampled_from(ADDRESSED), st.data())
def _an_accepted_identity_holds_only_addresses_a_tool_reads_as_one_value(case, data):
    """The launcher's environment parsed like flags: any text in a variable that carries an address or
    a name is refused, or the head's and the nodes' addresses and the names are single values (no
    space, newline, comma or leading '-')."""
    env, keys = case
    env = {**env, data.draw(st.sampled_from(keys)): data.draw(st.one_of(TEXT, PLAUSIBLE))}
    try:
        ident = detect(env)
    except InputError:
        OUTCOMES["identity addresses"]["refused"] += 1
        return
    OUTCOMES["identity addresses"]["accepted"] += 1
    for value in (ident.head_address, ident.hostname, ident.node_name, *ident.node_addresses):
        assert SAFE_ARG.fullmatch(value), value


def test_an_accepted_identity_holds_only_addresses_a_tool_reads_as_one_value():
    _share("identity addresses", _an_accepted_identity_holds_only_addresses_a_tool_reads_as_one_value)


HANDLE_FIELDS = {"slurm": ("job_id", "head_node", "job_name", "log"), "skypilot": ("cluster", "job_id", "job_name"),
                 "k8s": ("namespace", "job_name", "head_pod")}
GOOD_HANDLES = {"slurm": {"job_id": "42", "head_node": "n1", "log": "/tmp/raytrain/logs/job-42.out", "job_name": "job"},
                "skypilot": {"cluster": "job", "job_id": "1", "nodes": 2, "job_name": "job"},
                "k8s": {"namespace": "default", "job_name": "job", "head_pod": "job-head-0"}}


@FUZZ
@given(st.sampled_from(sorted(HANDLE_FIELDS)), st.data())
def _a_held_record_passes_only_values_a_tool_reads_as_one_value(target, data):
    """build/clusters.json's handle, any text in any field: refused naming the field, or every value
    that reaches squeue/scancel/srun/sky/kubectl is one argument that is not an option."""
    field = data.draw(st.sampled_from(HANDLE_FIELDS[target]))
    handle = {**GOOD_HANDLES[target], field: data.draw(st.one_of(TEXT, PLAUSIBLE, PLAUSIBLE))}
    try:
        checked = check_handle(target, handle, "clusters.json [job]", "job")
    except InputError as e:
        assert f"handle.{field}" in str(e)
        OUTCOMES["held records"]["refused"] += 1
        return
    OUTCOMES["held records"]["accepted"] += 1
    value = getattr(checked, field)
    assert SAFE_ARG.fullmatch(value) or (field == "log" and value.startswith("/") and "\n" not in value), value


def test_a_held_record_passes_only_values_a_tool_reads_as_one_value():
    _share("held records", _a_held_record_passes_only_values_a_tool_reads_as_one_value)


TAR_NAMES = st.sampled_from(["raytrain-code/abc", "raytrain-code/abc/a", "raytrain-code/abc/a/b", "raytrain-code/abc/..",
                             "raytrain-code/abc/../x", "/tmp/x", "raytrain-code", "raytrain-code/other/y", "", "a",
                             "raytrain-code/abc/a/../../b", "raytrain-code/abc/\x00", "raytrain-code/abc/" + "n" * 300])
TAR_KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
LINK_TARGETS = st.sampled_from(["..", ".", "/etc", "/tmp", "a", "../../..", "raytrain-code/abc/a", ""])


@FUZZ
@given(st.lists(st.tuples(TAR_NAMES, TAR_KINDS, LINK_TARGETS), min_size=1, max_size=6), st.integers(0, 2))
def test_a_code_tar_is_unpacked_whole_inside_its_root_or_not_at_all(tmp_path_factory, members, cut):
    """Any tar of hostile names, links and special files, possibly cut short: refused with nothing
    written, or unpacked as regular files and directories under the run's directory only."""
    import io

    from runtime.cluster import code_unpack
    from scripts.probe_inputs import tar_of
    base = tmp_path_factory.mktemp("tar")
    root, outside = base / "root", base / "outside"
    outside.mkdir()
    data = tar_of(*[(n, k, b"x" if k == tarfile.REGTYPE else t) for n, k, t in members])
    data = data[:len(data) - 512 * cut] if cut else data
    try:
        code_unpack.unpack(root, root / "raytrain-code/abc", io.BytesIO(data))
    except InputError:
        assert not root.exists() or not any(root.rglob("*")), sorted(map(str, root.rglob("*")))
    else:
        for p in root.rglob("*"):
            assert not p.is_symlink() and (p.is_file() or p.is_dir()), p
            rel = p.relative_to(root).as_posix()
            assert rel in ("raytrain-code", "raytrain-code/abc") or rel.startswith("raytrain-code/abc/"), rel
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in base.iterdir()) in (["outside"], ["outside", "root"])

"""One parser per kind of value, one error boundary (issue 19, round 2).

Each mechanism gets the kinds of input a hostile probe found: Unicode digits, NaN and infinity,
duplicate JSON keys, trailing newlines, unwritable --out paths, settings from the environment and
from a config file. The outcome is a value or a clear refusal (exit 2), within bounded time, never a
traceback.
"""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from invoke import Config

from deploy.artifacts import write_all
from deploy.job import DeployError
from runtime import numbers, strict_json
from runtime.errors import InputError
from runtime.cluster.identity import IdentityError, detect
from runtime.spec import SpecError, load_spec
from runtime.wait import holds_within, wait_until
from toolchain import boundary, records
from toolchain.config import ConfigError, check_env, defaults, load_settings
from toolchain.project import Located

ROOT = Path(__file__).resolve().parent.parent
RAYTRAIN = [sys.executable, "-m", "toolchain.cli"]

HOSTILE_NUMBERS = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e308", "1e999", "١٫٥", "²", "1_0", "0x10",
                   " 5", "5 ", "5\n", "", "--1", "1e", ".", "+"]


def raytrain(*args, env=None, cwd=ROOT, timeout=120):
    return subprocess.run(RAYTRAIN + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# -- finite floats ------------------------------------------------------------------------------
@given(st.one_of(st.text(max_size=30), st.sampled_from(HOSTILE_NUMBERS)))
def test_finite_from_text_is_a_bounded_number_or_a_refusal(text):
    try:
        value = numbers.finite(text, "--timeout", 0, 3600)
    except InputError as e:
        assert str(e).startswith("--timeout: ")
        return
    assert text.isascii() and math.isfinite(value) and 0 <= value <= 3600


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.none()))
def test_finite_from_python_values(value):
    try:
        got = numbers.finite(value, "call_timeout_s", 0, 86400, low_open=True)
    except InputError as e:
        assert "call_timeout_s" in str(e)
        assert value is None or isinstance(value, bool) or not (0 < value <= 86400) or not math.isfinite(value)
        return
    assert not isinstance(value, bool) and 0 < got <= 86400


def test_a_nan_deadline_is_refused_at_once_instead_of_spinning():
    t0 = time.monotonic()
    for bad in (float("nan"), float("inf"), 1e308, -1):
        with pytest.raises(InputError, match="timeout for the thing"):
            wait_until(lambda: False, timeout_s=bad, what="the thing")
    assert time.monotonic() - t0 < 1


def test_holds_within_says_whether_the_wait_succeeded_and_keeps_the_bounds():
    calls = iter([False, False, True])
    assert holds_within(lambda: next(calls), timeout_s=5, interval_s=0.01, what="the third poll") is True
    assert holds_within(lambda: False, timeout_s=0.05, interval_s=0.01, what="nothing") is False
    with pytest.raises(InputError, match="timeout for the thing"):  # a bad bound is still an error, not False
        holds_within(lambda: False, timeout_s=float("nan"), what="the thing")


# -- strict booleans ----------------------------------------------------------------------------
@given(st.one_of(st.text(max_size=10), st.integers(), st.booleans(), st.lists(st.booleans(), max_size=2)))
def test_boolean_is_true_false_or_a_refusal(value):
    try:
        got = numbers.boolean(value, "quiet")
    except InputError as e:
        assert str(e).startswith("quiet: ")
        assert not isinstance(value, bool)
        return
    assert got is (value if isinstance(value, bool) else value.strip().lower() in {"1", "true", "yes", "on"})


@pytest.mark.parametrize("text,expect", [("false", "0"), ("FALSE", "0"), ("no", "0"), ("0", "0"), ("true", "1"),
                                         ("yes", "1"), ("1", "1")])
def test_invoke_booleans_from_the_environment_mean_what_they_say(text, expect):
    # Invoke itself reads every value but '0' and '' as True: 'false' would mean True
    problems, rewrites = check_env({"INVOKE_QUIET": text})
    assert problems == [] and rewrites == {"INVOKE_QUIET": expect}


def test_an_unreadable_boolean_in_the_environment_is_refused():
    problems, _ = check_env({"INVOKE_REGISTRY_START_LOCAL": "maybe"})
    assert len(problems) == 1 and "INVOKE_REGISTRY_START_LOCAL: 'maybe' is not a boolean" in problems[0]


# -- settings from the environment and from a config file ---------------------------------------
SETTING_VARS = ["INVOKE_DEPLOY_NODES", "INVOKE_DEPLOY_CPUS_PER_NODE", "INVOKE_DEPLOY_PORT_BASE",
                "INVOKE_REGISTRY_RETRIES", "INVOKE_REGISTRY_RETRY_BACKOFF_S", "INVOKE_REGISTRY_STALL_TIMEOUT_S",
                "INVOKE_IMAGE_USER_UID", "INVOKE_QUIET", "INVOKE_REGISTRY_START_LOCAL"]


@given(st.sampled_from(SETTING_VARS), st.one_of(st.text(max_size=12), st.sampled_from(HOSTILE_NUMBERS)))
def test_every_invoke_variable_is_checked_the_way_the_settings_are(var, text):
    problems, rewrites = check_env({var: text})
    if problems:
        assert len(problems) == 1 and problems[0].startswith(var)
        return
    if var in rewrites:
        assert rewrites[var] in ("0", "1")
    elif var.endswith("_S"):
        assert text.isascii() and math.isfinite(float(text))
    else:
        assert text.isascii() and text.isdigit()


def _config(tree: dict) -> Config:
    c = Config(defaults=defaults())
    c.load_overrides(tree)
    return c


@given(st.sampled_from([("deploy", "nodes"), ("deploy", "cpus_per_node"), ("deploy", "port_base"),
                        ("registry", "retries"), ("registry", "retry_backoff_s"), ("registry", "stall_timeout_s"),
                        ("registry", "start_local"), ("image", "user", "uid")]),
       st.one_of(st.booleans(), st.text(max_size=6), st.integers(-5, 10**6), st.none(),
                 st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=2)))
def test_settings_from_a_config_file_are_strict(path, value):
    tree: dict = {}
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    try:
        s = load_settings(_config(tree), Located(ROOT, None))
    except ConfigError as e:
        assert ".".join(path) in str(e)
        return
    got = s
    for key in path:
        got = getattr(got, key)
    # only a value of the setting's own type got through: True is not 1, '2' is not 2, NaN is no number
    default = defaults()
    for key in path:
        default = default[key]
    assert type(got) is type(default) or (isinstance(default, float) and type(value) is int)
    assert got == value and (not isinstance(got, float) or math.isfinite(got))


# -- duplicate keys and non-JSON constants --------------------------------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=8)


@given(st.dictionaries(st.text(min_size=1, max_size=6), json_values, min_size=1, max_size=4), st.data(),
       st.integers(0, 3))
def test_a_duplicate_key_at_any_depth_is_refused(obj, data, depth):
    key = data.draw(st.sampled_from(sorted(obj)))
    text = json.dumps(obj)[:-1] + ", " + json.dumps(key) + ": 0}"
    for _ in range(depth):
        text = '{"outer": [' + text + "]}"
    with pytest.raises(strict_json.StrictJSONError, match="appears twice"):
        strict_json.loads(text)
    assert strict_json.loads(json.dumps(obj)) == obj  # the same object without the duplicate reads as before


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(word):
    with pytest.raises(strict_json.StrictJSONError, match="not a JSON number"):
        strict_json.loads('{"a": [1, %s]}' % word)


def test_a_spec_whose_first_value_was_invalid_is_not_rescued_by_a_second(tmp_path):
    good = json.loads((ROOT / "cluster_specs" / "local.json").read_text())
    text = json.dumps(good)[:-1] + ', "cluster_type": "local"}'
    text = text.replace('"cluster_type": "local"', '"cluster_type": "mainframe"', 1)
    spec = tmp_path / "dup.json"
    spec.write_text(text)
    with pytest.raises(SpecError, match="'cluster_type' appears twice"):
        load_spec(spec)


def test_a_record_with_a_duplicate_key_or_unreadable_is_refused(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "images.json").write_text('{"cpu": {}, "cpu": {}}')
    with pytest.raises(InputError, match="appears twice.*invoke push"):
        records.read_pushes(build)
    # a regular file that cannot be read (even by root): /proc/self/mem
    with pytest.raises(InputError, match="/proc/self/mem cannot be read"):
        records._read(Path("/proc/self/mem"), records.PushRecord, "invoke push")


# -- scheduler variables: zero is refused, never replaced ---------------------------------------
@pytest.mark.parametrize("env,needle", [
    ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NNODES": "0"}, "SLURM_NNODES='0'"),
    ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_NUM_NODES": "0",
      "SLURM_NNODES": "3"}, "SLURM_STEP_NUM_NODES='0'"),
    ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "a\nb", "SKYPILOT_NUM_NODES": "0"}, "SKYPILOT_NUM_NODES='0'"),
    ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "gpu:٣"},
     "SLURM_GPUS_ON_NODE"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "RAYTRAIN_HEAD_ADDRESS": "h", "HOSTNAME": "train-٣",
      "RAYTRAIN_NUM_NODES": "2"}, "no JOB_COMPLETION_INDEX"),
])
def test_scheduler_counts_of_zero_and_unicode_digits_are_refused(env, needle):
    with pytest.raises(IdentityError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        detect(env)


# -- launcher flags -----------------------------------------------------------------------------
@pytest.mark.parametrize("flag,value", [("--port-stride", "-1"), ("--port-stride", "²"), ("--barrier-timeout", "nan"),
                                        ("--join-timeout", "inf"), ("--barrier-timeout", "0"), ("--num-cpus", "0"),
                                        ("--port-base", "70000"), ("--warm-hosts", "1_0")])
def test_launcher_flags_are_parsed_by_the_one_parser(flag, value, capsys):
    from runtime.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["launch", flag, value, "--", "true"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}" in err and "Traceback" not in err


# -- writing artifacts: every OSError is one line naming --out ----------------------------------
def _unwritable(tmp_path: Path, kind: str, name: str) -> Path:
    if kind == "proc":
        return Path("/proc") / name
    if kind == "sys":
        return Path("/sys") / name / "x"
    if kind == "under_file":
        f = tmp_path / "afile"
        f.write_text("x")
        return f / name
    if kind == "long":
        return tmp_path / (name * 256)[:300]  # over 255 bytes
    if kind == "artifact_is_dir":
        (tmp_path / "out" / "job.sbatch").mkdir(parents=True, exist_ok=True)
        return tmp_path / "out"
    raise AssertionError(kind)


@hsettings(max_examples=30, deadline=None)
@given(st.sampled_from(["proc", "sys", "under_file", "long", "artifact_is_dir"]),
       st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8))
def test_unwritable_out_paths_are_one_clear_error_and_write_nothing(tmp_path_factory, kind, name):
    tmp_path = tmp_path_factory.mktemp("out")
    out = _unwritable(tmp_path, kind, name)
    before = sorted(p.name for p in out.parent.iterdir()) if out.parent.is_dir() and kind != "proc" else None
    with pytest.raises(DeployError) as e:
        write_all(out, {"job.sbatch": "#!/bin/bash\n", "README": "x"})
    assert str(e.value).startswith(f"--out {out}: ")
    if before is not None:
        assert sorted(p.name for p in out.parent.iterdir()) == before  # no scratch directory left behind


def test_a_read_only_mount_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        with pytest.raises(DeployError, match="Read-only file system.*EROFS"):
            write_all(ro / "x", {"a": "b"})
    finally:
        subprocess.run(["umount", str(ro)], check=True)


# -- the error boundary of the whole program ----------------------------------------------------
def test_the_boundary_names_a_bug_as_one():
    assert boundary.explain(KeyError("x")) is None
    assert boundary.explain(InputError("x: bad")).code == 2
    failure = boundary.explain(PermissionError(13, "Permission denied", "/root/x"))
    assert failure.code == 2 and "/root/x: Permission denied (EACCES)" in failure.message


BOMB = "unused:\n" + "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n"
                              for i in range(8))


@pytest.mark.parametrize("value", ["", "  ", "build\nx"])
def test_an_empty_blank_or_multiline_path_setting_is_refused(tmp_path, value):
    """An empty INVOKE_PROJECT_BUILD_DIR was the project root itself: status read, and deploy wrote,
    records there."""
    (tmp_path / "raytrain.yaml").write_text("{}\n")  # a project of defaults
    r = raytrain("status", cwd=tmp_path, env={"INVOKE_PROJECT_BUILD_DIR": value})
    assert r.returncode == 2 and "project.build_dir: " in r.stderr, (r.returncode, r.stdout, r.stderr)



@pytest.mark.parametrize("files,args,needle", [
    ({"bad.yaml": "deploy:\n  nodes: [\n"}, ["-f", "bad.yaml", "spec.check", "cluster_specs/local.json"], "line 3"),
    ({"list.yaml": "deploy: [1, 2]\n"}, ["-f", "list.yaml", "spec.check", "cluster_specs/local.json"],
     "Can't cleanly merge"),
    ({"x.txt": "deploy: {}\n"}, ["-f", "x.txt", "spec.check", "cluster_specs/local.json"], "type 'txt'"),
    ({}, ["-f", "missing.yaml", "spec.check", "cluster_specs/local.json"], "no such file"),
    ({"dup.yaml": "deploy:\n  nodes: 0\n  nodes: 2\n"}, ["-f", "dup.yaml", "deploy", "--target", "slurm", "--dry-run"],
     "key 'nodes' appears twice"),
    ({}, ["deploy", "--target", "slurm", "--nodes", " 7", "--dry-run"], "--nodes: ' 7' is not a whole number"),
    ({}, ["deploy", "--target", "slurm", "--partition", "-rf", "--dry-run"], "--partition"),
    ({"n.yaml": "deploy:\n  nodes: true\n"}, ["-f", "n.yaml", "deploy", "--target", "slurm", "--dry-run"],
     "deploy.nodes"),
    ({"q.yaml": "deploy:\n  nodes: '2'\n"}, ["-f", "q.yaml", "deploy", "--target", "slurm", "--dry-run"],
     "deploy.nodes"),
    ({}, ["deploy", "--target", "", "--dry-run"], "--target: empty"),
    ({}, ["deploy", "--target", "slurm", "--spec", " ", "--dry-run"], "--spec: empty"),
    ({}, ["build", "--variant", ""], "--variant: empty"),
    ({"bomb.yaml": BOMB}, ["-f", "bomb.yaml", "spec.check", "cluster_specs/local.json"], "more than 20 aliases"),
    ({"deep.yaml": "x: " + "[" * 5000 + "]" * 5000 + "\n"}, ["-f", "deep.yaml", "spec.check", "cluster_specs/local.json"],
     "nested more than 32 deep"),
    ({"deep.json": '{"x": ' + "[" * 5000 + "]" * 5000 + "}"}, ["-f", "deep.json", "spec.check",
                                                                 "cluster_specs/local.json"], "nested too deep"),
    ({"s.yaml": "deploy:\n  nodes: 1:20\n"}, ["-f", "s.yaml", "deploy", "--target", "slurm", "--dry-run"],
     "deploy.nodes"),
])
def test_config_files_and_empty_flags_are_one_line_and_exit_2(tmp_path, files, args, needle):
    (tmp_path / "raytrain.yaml").write_text(f"project:\n  spec: {ROOT}/cluster_specs/local.json\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = [str(tmp_path / a) if a in files or a == "missing.yaml" else a for a in args]
    env = {"INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "build")}
    if "slurm" in args:
        env["INVOKE_PROJECT_SPEC"] = str(ROOT / "cluster_specs" / "slurm.json")
    r = raytrain(*args, cwd=tmp_path, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "build").exists()


def test_an_alias_bomb_anywhere_raytrain_reads_config_is_refused_at_once(tmp_path):
    """In ~/.invoke.yaml (read before any project code), in INVOKE_RUNTIME_CONFIG and in a FIFO given as -f."""
    from toolchain import config_files
    from toolchain.boundary import ConfigFileError
    (tmp_path / "bomb.yaml").write_text(BOMB)
    t0 = time.monotonic()
    with pytest.raises(ConfigFileError, match="more than 20 aliases"):
        config_files.load_yaml(tmp_path / "bomb.yaml")
    assert time.monotonic() - t0 < 1
    home = tmp_path / "home"
    home.mkdir()
    (home / ".invoke.yaml").write_text(BOMB)
    r = raytrain("--list", cwd=tmp_path, env={"HOME": str(home)})
    assert r.returncode == 2 and ".invoke.yaml: line 5: more than 20 aliases" in r.stderr, r.stderr[-2000:]
    check = ["spec.check", str(ROOT / "cluster_specs" / "local.json")]
    r = raytrain(*check, cwd=tmp_path, env={"INVOKE_RUNTIME_CONFIG": str(tmp_path / "bomb.yaml")})
    assert r.returncode == 2 and "more than 20 aliases" in r.stderr, r.stderr[-2000:]
    os.mkfifo(tmp_path / "fifo.yaml")
    r = raytrain("-f", str(tmp_path / "fifo.yaml"), *check, cwd=tmp_path)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr[-2000:]


def test_raytrain_runs_from_any_directory(tmp_path):
    r = raytrain("spec.check", str(ROOT / "cluster_specs" / "local.json"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cluster_type"] == "local"


def test_an_re2_refusal_is_text_without_absl_noise(tmp_path):
    spec = json.loads((ROOT / "cluster_specs" / "local.json").read_text())
    spec["node_type_from_node_name"] = {"(?<=a)b": "cpu"}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    r = raytrain("spec.check", str(tmp_path / "s.json"))
    assert r.returncode == 2 and "invalid perl operator: (?<=" in r.stderr
    assert "absl" not in r.stderr and "(b'" not in r.stderr and "E0000" not in r.stderr, r.stderr


def test_out_on_proc_through_the_cli(tmp_path):
    r = raytrain("deploy", "--target", "slurm", "--out", "/proc/raytrain-out",
                 env={"INVOKE_PROJECT_BUILD_DIR": str(tmp_path / "build")})
    assert r.returncode == 2 and "--out /proc/raytrain-out: cannot write the artifacts there" in r.stderr
    assert "Traceback" not in r.stderr


# -- worker-group options: the option's name, before Ray sees the value --------------------------
@pytest.mark.parametrize("option,value", [("call_timeout_s", float("nan")), ("call_timeout_s", -1),
                                          ("init_timeout_s", float("inf")), ("max_restarts", -1),
                                          ("max_restarts", True), ("colocated_share", 1.5), ("memory_limit", -5),
                                          ("memory_limit", True), ("memory_limit", 2.5)])
def test_worker_group_options_are_refused_by_name(option, value):
    from runtime.workers.worker_group import RayWorkerGroup
    with pytest.raises(InputError, match=f"^{option}: "):
        RayWorkerGroup(None, object, **{option: value})  # checked before the cluster is touched


def test_a_cluster_name_is_one_line_of_text(tmp_path):
    spec = json.loads((ROOT / "cluster_specs" / "local.json").read_text())
    spec["cluster_name"] = "a\nb"
    (tmp_path / "s.json").write_text(json.dumps(spec))
    with pytest.raises(SpecError, match="cluster_name"):
        load_spec(tmp_path / "s.json")


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", "job\nname", "Job", "-lead", "x" * 41])
def test_a_job_name_that_is_no_dns_label_never_reaches_the_serving_socket_path(name):
    from runtime.cluster.serving import socket_path
    from runtime.contract import JOB_NAME
    with pytest.raises(InputError, match="RAYTRAIN_JOB_NAME"):
        socket_path({JOB_NAME: name})
    assert socket_path({JOB_NAME: "ok-job"}).name == "raytrain-serving-ok-job.sock"


@pytest.mark.parametrize("command", ["--foo --uid=0", "-w n2 python train.py", "--export=ALL,LD_PRELOAD=/x.so id"])
def test_a_command_that_starts_with_an_option_is_refused_before_any_tool_sees_it(command):
    """Whatever follows a scheduler tool's own options (srun, kubectl exec, sky exec) starts with a program:
    a command that starts with an option is refused where it is parsed (--command) and in the job model
    (deploy.command from a settings file)."""
    from deploy.job import make_job
    from deploy.plan import PreflightError
    from toolchain.errors import ConfigError
    from toolchain.job_inputs import parse_command
    with pytest.raises(ConfigError, match="is an option, not a program"):
        parse_command(command)
    import shlex
    with pytest.raises(PreflightError, match="is an option, not a program"):
        make_job(name="job", nodes=2, cpus_per_node=2, command=shlex.split(command))
    assert parse_command("python train.py --uid=0") == ["python", "train.py", "--uid=0"]


def test_the_build_directorys_files_are_never_written_through_a_planted_link(tmp_path):
    """runs.json, clusters.json and the blob cache's sidecars go through toolchain.atomic: a link planted
    under the old temporary name, or at the file itself, is not followed."""
    from toolchain.atomic import write_atomic
    from toolchain.records import _write
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    build = tmp_path / "build"
    build.mkdir()
    for name in ("runs.json.tmp", "clusters.json.tmp", ".runs.json.partial"):
        (build / name).symlink_to(outside)
    _write(build / "runs.json", {})  # the records' own writer
    assert outside.read_text() == "keep" and (build / "runs.json").read_bytes() == b"{}\n"
    (build / "clusters.json").symlink_to(outside)
    write_atomic(build / "clusters.json", "{}\n")
    assert outside.read_text() == "keep" and not (build / "clusters.json").is_symlink()
    assert not list(build.glob(".*.partial*")) or all(p.is_symlink() for p in build.glob(".*.partial*"))


@pytest.mark.parametrize("pid_text", ["-1", "0", "1", "-{pid}", "{pid}", "{pid}\n", "99999999999"])
def test_registry_stop_signals_only_the_registry_it_started(tmp_path, app_dir, pid_text):
    """registry.pid naming another process (here a `sleep`), a process group, every process (-1) or
    garbage: `registry.stop` signals nothing and removes the file."""
    from conftest import make_settings
    from toolchain.publish.local_registry import _paths, stop_local
    s = make_settings(tmp_path / "w", app_dir)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _, _, pidfile = _paths(s)
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(pid_text.format(pid=bystander.pid))
        assert stop_local(s) is False
        assert bystander.poll() is None  # not signalled
        assert not pidfile.exists()
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("values,fault", [(None, "is not a list"), ("ab", "is not a list"), (b"ab", "is not a list"),
                                          ({"a": 1, "b": 2}, "is not a list"), ([1, 2, 3], "3 items for 2 workers")])
def test_per_worker_data_is_a_list_with_one_item_per_worker(values, fault):
    """run_all_workers_multiple_data (the core's data_list, the NeMo RL face's keywords): text is not split
    into characters, None is not a TypeError, a wrong length names both numbers."""
    from runtime.workers.transfer import per_worker
    with pytest.raises(InputError, match=fault):
        per_worker(values, "data", 2)
    per_worker([1, 2], "data", 2)
    per_worker((1, 2), "data")


@pytest.mark.parametrize("value", [10 ** 400, -10 ** 400])
def test_a_number_past_a_floats_range_is_out_of_range_not_an_overflow(value):
    with pytest.raises(InputError, match="call_timeout_s: .* is out of range"):
        numbers.finite(value, "call_timeout_s")


@pytest.mark.parametrize("text,value", [("010", 10), ("020000", 20000), ("+12", 12), ("0o17", 15), ("0x1F", 31),
                                        ("1_0", "1_0"), ("1:20", "1:20"), ("1e3", 1000.0), ("007.5", 7.5)])
def test_yaml_numbers_are_read_as_yaml_1_2_says(tmp_path, text, value):
    """One reading of a number, the same as an INVOKE_* variable's: decimal digits (no leading-zero octal),
    no `_` separators, no base 60; what is not a number stays text for the settings to refuse."""
    from toolchain import config_files
    (tmp_path / "c.yaml").write_text(f"x: {text}\n")
    got = config_files.load_yaml(tmp_path / "c.yaml")["x"]
    assert got == value and type(got) is type(value)


def test_a_bom_inside_and_aliases_that_expand_past_the_bound_are_refused(tmp_path):
    from toolchain import config_files
    from toolchain.boundary import ConfigFileError
    (tmp_path / "bom.yaml").write_text("deploy:\n  nodes: 2\n\ufeffproject: {}\n")
    with pytest.raises(ConfigFileError, match="line 3: a byte-order mark inside the text"):
        config_files.load_yaml(tmp_path / "bom.yaml")
    (tmp_path / "start.yaml").write_text("\ufeffdeploy:\n  nodes: 2\n")  # at the very start: allowed
    assert config_files.load_yaml(tmp_path / "start.yaml") == {"deploy": {"nodes": 2}}
    # 19 aliases (under the cap of 20), each doubling a 5,000-item list: 2.5 million values once expanded
    doubling = "a: &a [" + ",".join(["1"] * 5000) + "]\nb0: &b0 [*a, *a]\n" + "".join(
        f"b{i}: &b{i} [*b{i - 1}, *b{i - 1}]\n" for i in range(1, 9))
    (tmp_path / "doubling.yaml").write_text(doubling)
    t0 = time.monotonic()
    with pytest.raises(ConfigFileError, match="aliases expand to more than 20000 values"):
        config_files.load_yaml(tmp_path / "doubling.yaml")
    assert time.monotonic() - t0 < 5


def test_registry_stop_says_when_a_registry_it_did_not_start_answers(tmp_path):
    """A pid file naming another process (or a FIFO in its place), and a registry answering at the address:
    `registry.stop` signals nothing and says that registry is not this project's, instead of 'not running'."""
    import http.server
    import threading

    class V2(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), V2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    data = tmp_path / "registry"
    data.mkdir()
    env = {"INVOKE_REGISTRY_ADDRESS": f"127.0.0.1:{server.server_address[1]}", "INVOKE_REGISTRY_DATA_DIR": str(data)}
    try:
        for decoy in ("pid", "fifo"):
            if decoy == "pid":
                (data / "registry.pid").write_text(str(os.getpid()))
            else:
                os.mkfifo(data / "registry.pid")
            r = raytrain("registry.stop", env=env, timeout=30)
            assert r.returncode == 0 and "not stopped: a registry answers at 127.0.0.1:" in r.stdout, (r.stdout, r.stderr)
            assert not (data / "registry.pid").exists()
        server.shutdown()
        server.server_close()
        r = raytrain("registry.stop", env=env, timeout=30)
        assert "not running (nothing started by this project)" in r.stdout, r.stdout
    finally:
        server.server_close()

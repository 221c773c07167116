"""`invoke deploy`'s target flags come from the targets' Options models, one definition each.

Every Options field is a flag with its description as help (naming the targets that take it), no
flag exists that no target takes, a switch is exactly a bool field, two targets that share an
option define it the same way, and a bad whole number exits 2 naming its flag.
"""
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from pydantic import Field

from deploy.job import PreflightError
from deploy.targets import TARGETS
from deploy.targets.base import TargetOptions, is_cli
from deploy.targets.flags import FLAGS, FlagConflict, TargetFlags

ROOT = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]
# the deploy task's own flags (the job, not a target's option), declared in tasks.py
JOB_FLAGS = {"--target", "--spec", "--nodes", "--name", "--gpus", "--out", "--dry-run", "--command", "--resume",
             "--torchrun", "--nproc-per-node", "--max-restarts", "--env", "--quiet", "--json"}


def inv(*args):
    return subprocess.run(INVOKE + list(args), cwd=ROOT, capture_output=True, text=True, timeout=300)


def squash(text: str) -> str:
    """Text without whitespace: --help wraps lines (and may break after a hyphen)."""
    return "".join(text.split())


@pytest.fixture(scope="module")
def help_flags() -> dict[str, tuple[bool, str]]:
    """`invoke deploy --help` as {--flag: (takes a value, its help text)}."""
    r = inv("deploy", "--help")
    assert r.returncode == 0, r.stderr
    flags: dict[str, list] = {}
    current = None
    for line in r.stdout.split("Options:", 1)[1].splitlines():
        m = re.match(r"^  (--[a-z0-9-]+)(=\w+)?\s*(.*)$", line)
        if m:
            current = m.group(1)
            flags[current] = [m.group(2) is not None, m.group(3)]
        elif current and line.strip():
            flags[current][1] += " " + line.strip()
    return {k: (v[0], v[1]) for k, v in flags.items()}


def cli_fields():
    """(target, field name, FieldInfo) for every target option the CLI offers."""
    return [(t, name, info) for t, target in TARGETS.items()
            for name, info in target.Options.model_fields.items() if is_cli(info)]


def test_every_option_of_every_target_is_a_flag_with_its_help(help_flags):
    for tname, name, info in cli_fields():
        flag = "--" + name.replace("_", "-")
        assert flag in help_flags, f"{tname}'s option {name!r} has no {flag} flag"
        text = help_flags[flag][1]
        assert info.description and squash(info.description) in squash(text), (flag, text)
        who = text.split(":", 1)[0]
        owners = [t for t, target in TARGETS.items() if name in target.Options.model_fields]
        assert who == ("every target" if len(owners) == len(TARGETS) else "/".join(owners)), (flag, text)
        assert tname in owners


def test_no_flag_that_no_target_takes(help_flags):
    options = {"--" + name.replace("_", "-") for _, name, _ in cli_fields()}
    assert set(help_flags) - JOB_FLAGS == options
    assert set(FLAGS.flags) == {name for _, name, _ in cli_fields()}
    # plumbing the pipeline sets is an Options field, not a flag
    assert "sqsh_dir" in TARGETS["pyxis"].Options.model_fields and "--sqsh-dir" not in help_flags
    r = inv("deploy", "--target", "pyxis", "--sqsh-dir", "/tmp/x", "--dry-run")
    assert r.returncode != 0 and "--sqsh-dir" in r.stderr + r.stdout


def test_every_flag_has_help_a_user_can_act_on(help_flags):
    for flag, (_, text) in help_flags.items():
        assert len(text.split()) > 3, (flag, text)


def test_a_switch_is_exactly_a_bool_option(help_flags):
    for _, name, info in cli_fields():
        takes_value, _ = help_flags["--" + name.replace("_", "-")]
        assert takes_value == (info.annotation is not bool), (name, info.annotation)
    for f in FLAGS:
        assert f.cli_default is (False if f.field.annotation is bool else None)


def test_whole_number_flags_say_their_bounds(help_flags):
    assert squash("A whole number, 0-1000.") in squash(help_flags["--port-stride"][1])
    assert squash("A whole number, 0-64.") in squash(help_flags["--spare-nodes"][1])


def test_targets_that_share_an_option_define_it_the_same_way():
    by_name: dict[str, list] = {}
    for tname, name, info in cli_fields():
        by_name.setdefault(name, []).append((tname, info))
    shared = {n: defs for n, defs in by_name.items() if len(defs) > 1}
    assert {"allow_local_registry", "seeds", "submit", "port_stride"} <= set(shared)
    for name, defs in shared.items():
        (t0, first), *rest = defs
        for t, info in rest:
            assert info.annotation == first.annotation, (name, t0, t)
            assert info.description == first.description, (name, t0, t)
            assert info.get_default(call_default_factory=True) == first.get_default(call_default_factory=True)
            assert repr(info.metadata) == repr(first.metadata), (name, t0, t)


def _fake(name: str, options: type) -> object:
    return type(name, (), {"Options": options, "name": name})()


@pytest.mark.parametrize("other,what", [
    ({"port_stride": (int, Field(0, ge=0, le=1000, description="another text."))}, "help"),
    ({"port_stride": (str, Field("0", description="offset."))}, "type"),
    ({"port_stride": (int, Field(0, ge=0, le=99, description="offset."))}, "constraints"),
    ({"port_stride": (int, Field(5, ge=0, le=1000, description="offset."))}, "default"),
])
def test_two_targets_defining_one_option_differently_are_refused(other, what):
    from pydantic import create_model
    a = create_model("A", __base__=TargetOptions,
                     port_stride=(int, Field(0, ge=0, le=1000, description="offset.")))
    b = create_model("B", __base__=TargetOptions, **other)
    TargetFlags.collect({"a": _fake("a", a), "b": _fake("b", a)})  # the same definition: one flag
    with pytest.raises(FlagConflict, match=f"port_stride.*a and b.*{what}"):
        TargetFlags.collect({"a": _fake("a", a), "b": _fake("b", b)})


def test_an_option_without_help_or_with_a_type_the_cli_cannot_take_is_refused():
    from pydantic import create_model
    bare = create_model("Bare", __base__=TargetOptions, zone=(Optional[str], None))
    with pytest.raises(FlagConflict, match="zone.*no description"):
        TargetFlags.collect({"x": _fake("x", bare)})
    odd = create_model("Odd", __base__=TargetOptions, ratio=(float, Field(0.5, description="a ratio.")))
    with pytest.raises(FlagConflict, match="ratio"):
        TargetFlags.collect({"x": _fake("x", odd)})


def test_only_the_flags_the_user_set_reach_the_target():
    defaults = {f.name: f.cli_default for f in FLAGS}
    assert FLAGS.given(defaults) == {}
    got = FLAGS.given({**defaults, "port_stride": "7", "sqsh": True, "seeds": "1-2", "partition": "gpu"})
    assert got == {"port_stride": 7, "sqsh": True, "seeds": "1-2", "partition": "gpu"}
    with pytest.raises(PreflightError, match="--port-stride: not an option of the k8s target"):
        TARGETS["k8s"].parse_options(FLAGS.given({"port_stride": "10"}))


def test_seeds_and_slots_become_lists_in_the_options_model():
    k8s = TARGETS["k8s"].parse_options(FLAGS.given({"seeds": "1-3,7", "slots": "n1:0,n2"}))
    sky = TARGETS["skypilot"].parse_options(FLAGS.given({"seeds": "1-3,7"}))
    assert k8s.seeds == sky.seeds == [1, 2, 3, 7]
    assert [(s.node, s.gpu) for s in k8s.slots] == [("n1", 0), ("n2", None)]
    with pytest.raises(Exception, match="--seeds"):
        TARGETS["skypilot"].parse_options({"seeds": "²"})


@pytest.mark.parametrize("args,needle", [
    (["--port-stride", "²"], "error: --port-stride: '²' is not a whole number between 0 and 1000"),
    (["--port-stride", "1001"], "error: --port-stride: '1001' is not a whole number between 0 and 1000"),
    (["--spare-nodes", "65"], "error: --spare-nodes: '65' is not a whole number between 0 and 64"),
])
def test_a_bad_whole_number_exits_2_naming_the_flag(args, needle):
    r = inv("deploy", "--target", "slurm", *args, "--dry-run")
    assert r.returncode == 2 and needle in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr

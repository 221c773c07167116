"""Whole numbers from text, in one place (runtime/numbers.py), at every boundary that takes one:
ASCII digits only, bounded, never a traceback."""
import json

import pytest
from hypothesis import given, strategies as st

from deploy.job import numeric_user
from deploy.targets import seeds
from runtime import numbers
from runtime.errors import InputError
from runtime.imageref import ImageRef, ImageRefError
from test_cli import inv

NOT_ASCII_DIGITS = ["²", "٣", "１", "1_0", " 7", "7 ", "+7", "-1", "0x10", "1e3", "", "७"]


@given(st.text(max_size=25))
def test_whole_is_a_value_or_a_clear_refusal(text):
    try:
        value = numbers.whole(text, "--x", 0, 10**12)
    except InputError as e:
        assert str(e).startswith("--x: ")
        return
    assert text.isascii() and text.isdigit() and value == int(text) and value <= 10**12


@pytest.mark.parametrize("text", NOT_ASCII_DIGITS)
def test_unicode_digits_signs_and_separators_are_refused_everywhere(text):
    with pytest.raises(InputError, match="ASCII digits 0-9 only|not a whole number"):
        numbers.whole(text, "--x")
    if not numbers.is_whole(text.strip()):  # --seeds is a whitespace- or comma-separated list
        with pytest.raises(Exception, match="--seeds"):
            seeds.parse_seeds(text or "²")
    assert numeric_user(f"{text}:{text}") == (None, None) or text == ""
    with pytest.raises(ImageRefError):
        ImageRef.parse(f"registry.example.com:{text or '²'}/x@sha256:" + "a" * 64)


@pytest.mark.parametrize("flag,value", [("--nodes", "²"), ("--nodes", "٣"), ("--gpus", "１"), ("--port-stride", "1_0")])
def test_count_flags_refuse_non_ascii_digits_with_exit_2(flag, value):
    r = inv("deploy", "--target", "slurm", flag, value, "--dry-run")
    assert r.returncode == 2 and f"{flag}: {value!r} is not a whole number" in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr

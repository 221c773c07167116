"""Numbers and booleans from text, parsed in one place: ASCII digits only, finite, bounded.

`str.isdigit()` accepts '²' (which `int()` then rejects with a traceback) and Arabic-Indic or
full-width digits (which `int()` silently converts), and `int()` alone takes '1_0' as 10 and
' 7 ' as 7. A count, a port, a uid or a seed from a flag, a record or a scheduler's variable is
the digits 0-9 and nothing else, with a bounded length.
"""
from __future__ import annotations

import argparse
import math
import re
from typing import Optional

from runtime.errors import InputError

COUNT_MAX = 999_999_999  # a count given as a flag with no bound of its own (nodes, GPUs, a target option)
_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?")


def is_whole(text: str) -> bool:
    """True for 1-18 ASCII digits and nothing else."""
    return bool(_DIGITS.fullmatch(text))


def whole(text: str, what: str, low: int = 0, high: Optional[int] = None) -> int:
    """The number TEXT spells, within [low, high]; InputError naming WHAT otherwise."""
    bound = f" between {low} and {high}" if high is not None else f" >= {low}"
    if not is_whole(text):
        raise InputError(f"{what}: {text[:40]!r} is not a whole number{bound} (ASCII digits 0-9 only)")
    value = int(text)
    if value < low or (high is not None and value > high):
        raise InputError(f"{what}: {text[:40]!r} is not a whole number{bound}")
    return value


def finite(value, what: str, low: float = 0.0, high: float = 7 * 86400.0, *, low_open: bool = False) -> float:
    """A finite number within [low, high] (or (low, high] with low_open) from text or a number.

    'nan' passes every comparison and never lets a deadline pass, 'inf' and '1e308' overflow
    `time.sleep`, and Python's `float()` takes '١٫٥' and '1_0': text is an optional sign, ASCII
    digits, one optional point and an optional exponent, nothing else. Booleans are not numbers.
    """
    bound = f"{'>' if low_open else '>='} {low:g} and <= {high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"{what}: {str(value)[:40]!r} is not a number; give a finite number {bound}")
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise InputError(f"{what}: {value[:40]!r} is not a number; give a finite number {bound} "
                             "(ASCII digits, e.g. 30 or 2.5)")
        value = float(value)
    try:
        value = float(value)
    except OverflowError:  # an int past a float's range (10**400)
        raise InputError(f"{what}: {str(value)[:40]}... is out of range; give a finite number {bound}") from None
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        raise InputError(f"{what}: {value!r} is out of range; give a finite number {bound}")
    return value


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def boolean(value, what: str) -> bool:
    """True or False from a bool or one of 1/0, true/false, yes/no, on/off (any case); nothing else.

    A number, a list or 'maybe' is refused rather than read by Python's truthiness."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:  # ' true ' is not a boolean either
        return value.lower() in _TRUE
    raise InputError(f"{what}: {str(value)[:40]!r} is not a boolean; give true or false (or 1/0, yes/no, on/off)")


def arg_whole(low: int = 0, high: Optional[int] = None):
    """An argparse `type=` for a whole-number flag (argparse prints the message and exits 2)."""
    def parse(text: str) -> int:
        try:
            return whole(text, "value", low, high)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None
    parse.__name__ = "whole number"
    return parse


def arg_finite(low: float = 0.0, high: float = 7 * 86400.0, *, low_open: bool = False):
    """An argparse `type=` for a finite-number flag within bounds."""
    def parse(text: str) -> float:
        try:
            return finite(text, "value", low, high, low_open=low_open)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None
    parse.__name__ = "finite number"
    return parse


def integer(value, what: str, low: int = 0, high: Optional[int] = None) -> int:
    """A whole number given as a Python int (not a bool, not a float) or as ASCII-digit text."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{what}: {str(value)[:40]!r} is not a whole number; give an int")
    if isinstance(value, str):
        return whole(value, what, low, high)
    if value < low or (high is not None and value > high):
        bound = f" between {low} and {high}" if high is not None else f" >= {low}"
        raise InputError(f"{what}: {value!r} is not a whole number{bound}")
    return value

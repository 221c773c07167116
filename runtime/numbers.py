"""Whole numbers from text, parsed in one place: ASCII digits only.

`str.isdigit()` accepts '²' (which `int()` then rejects with a traceback) and Arabic-Indic or
full-width digits (which `int()` silently converts), and `int()` alone takes '1_0' as 10 and
' 7 ' as 7. A count, a port, a uid or a seed from a flag, a record or a scheduler's variable is
the digits 0-9 and nothing else, with a bounded length.
"""
from __future__ import annotations

import re
from typing import Optional

from runtime.errors import InputError

_DIGITS = re.compile(r"[0-9]{1,18}")


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

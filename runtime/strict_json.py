"""JSON as the project reads it (specs, records): one reading for every file.

Python's `json` keeps the last of two equal keys (so an invalid first value vanishes unseen) and
accepts `NaN`, `Infinity` and `-Infinity`, which are not JSON. Both are refused here with the key
or the word, so a spec or a record means exactly what its text says.
"""
from __future__ import annotations

import json
from typing import Any


class StrictJSONError(ValueError):
    """Not the strict JSON the project reads; the message names the key or the constant."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"key {key[:80]!r} appears twice in one object; keep one (JSON readers "
                                  "disagree on which one wins)")
        out[key] = value
    return out


def _no_constant(word: str) -> Any:
    raise StrictJSONError(f"{word} is not a JSON number; give a finite number")


def loads(text: str) -> Any:
    """json.loads, refusing duplicate keys and NaN/Infinity (StrictJSONError, a ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)

"""Host addresses as the launcher takes them from a scheduler or a flag: an IP address or a DNS name,
parsed in one place. A value with spaces, a newline (a forged log line), `$(...)`, a URL or a leading
`-` (read as an option by the tools it reaches) is refused, naming where it came from."""
from __future__ import annotations

import ipaddress
import re

from runtime.errors import InputError

# RFC 1123 labels, plus '_' (some sites' Slurm node names): never a leading or trailing '-' or '.'
_LABEL = r"[A-Za-z0-9_](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
MAX_NAME = 253


def host(value: str, what: str) -> str:
    """VALUE when it is an IP address or a DNS name; InputError naming WHAT otherwise."""
    if isinstance(value, str) and value and len(value) <= MAX_NAME:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
        if _NAME.fullmatch(value):
            return value
    raise InputError(f"{what}={str(value)[:80]!r} is not an IP address or a DNS name (letters, digits, '-', '_' and "
                     "'.', at most 253 characters, no spaces or leading '-')")


def arg_host(text: str) -> str:
    """An argparse `type=` for an address flag (argparse prints the message and exits 2)."""
    import argparse
    try:
        return host(text, "value")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("value=")) from None

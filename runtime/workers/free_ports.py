"""Free TCP ports on this host, found one way: the port is bound (and listened on) here, then released.

    any_port()                        a port the kernel picks (a process group's master port)
    port_in_range(low, high, ...)     a port in [low, high): random picks, or every port once
    consecutive_ports(low, high, n)   the lowest base in [low, high) whose n ports are all bindable now

A port found here is free at the moment of the probe only: the caller hands it to what binds it next
(torch.distributed, an inference server) without delay. runtime.nemo_rl.virtual_cluster gives these
NeMo RL's names (_get_free_port_local, _bind_socket_in_range, _get_free_consecutive_ports_local).
"""
from __future__ import annotations

import random
import socket
from typing import Optional

from runtime import numbers
from runtime.errors import InputError

PORT_MAX = 65535


def _range(low, high, what: str) -> tuple[int, int]:
    """[low, high) as whole numbers within 1..65536 with low < high; else one line naming the bounds."""
    low = numbers.integer(low, f"{what}: low", 1, PORT_MAX)
    high = numbers.integer(high, f"{what}: high", 1, PORT_MAX + 1)
    if low >= high:
        raise InputError(f"{what}: the range [{low}, {high}) is empty; give low < high")
    return low, high


def _port_set(ports, what: str) -> set[int]:
    """A collection of port numbers (a set, list or tuple of whole numbers), as a set; None is none."""
    if ports is None:
        return set()
    if not isinstance(ports, (set, frozenset, list, tuple)):
        raise InputError(f"{what}: {str(ports)[:40]!r} is not a collection of ports; give a set of ints, e.g. {{45001}}")
    return {numbers.integer(p, what, 1, PORT_MAX) for p in ports}


def _bindable(port: int) -> Optional[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", port))
        s.listen(1)
        return s
    except OSError:
        s.close()
        return None


def bind_in_range(sock: socket.socket, low: int, high: int, max_retries: Optional[int] = 50,
                  excluded: Optional[set] = None) -> int:
    """Bind SOCK to a port in [low, high) and return it. max_retries=None: every port of the range (not
    excluded) once, in random order; else up to max_retries random picks. RuntimeError when none binds."""
    low, high = _range(low, high, "bind_in_range")
    if max_retries is not None:
        max_retries = numbers.integer(max_retries, "bind_in_range: max_retries", 1, 1_000_000)
    excluded = _port_set(excluded, "bind_in_range: excluded")
    if max_retries is None:
        candidates = [p for p in range(low, high) if p not in excluded]
        random.shuffle(candidates)
        tried = f"all {len(candidates)} available ports"
    else:
        candidates = (random.randint(low, high - 1) for _ in range(max_retries))
        tried = f"{max_retries} attempts"
    for port in candidates:
        if port in excluded:
            continue
        try:
            sock.bind(("", port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"Could not find a free port in range [{low}, {high}) after {tried}.")


def port_in_range(low: int, high: int, *, max_retries: Optional[int] = 50, excluded: Optional[set] = None) -> int:
    """A port in [low, high) that this host could bind just now (bound, listened on, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        port = bind_in_range(s, low, high, max_retries=max_retries, excluded=excluded)
        s.listen(1)
    return port


def any_port() -> int:
    """A port the kernel picks from its ephemeral range, free just now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def consecutive_ports(low: int, high: int, consecutive: int = 1, start: Optional[int] = None) -> int:
    """The lowest base at or above START (clamped to LOW) whose CONSECUTIVE ports, all below HIGH, this
    host can bind at once just now; RuntimeError when the range holds no such block. START is a
    caller's cursor, so that successive blocks (one per engine on a node) do not overlap."""
    low, high = _range(low, high, "consecutive_ports")
    consecutive = numbers.integer(consecutive, "consecutive_ports: consecutive", 1, PORT_MAX)
    if start is not None:
        start = numbers.integer(start, "consecutive_ports: start", 0, PORT_MAX + 1)
    base = low if start is None else max(start, low)
    while base + consecutive <= high:
        held: list[socket.socket] = []
        try:
            for offset in range(consecutive):
                s = _bindable(base + offset)
                if s is None:
                    break
                held.append(s)
            if len(held) == consecutive:
                return base
        finally:
            for s in held:
                s.close()
        base += len(held) + 1  # the port that did not bind cannot start a block either
    raise RuntimeError(f"Could not find {consecutive} consecutive free ports in [{low}, {high}).")

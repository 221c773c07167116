"""The one way the project finds free ports (runtime/workers/free_ports.py), against this host's real
sockets: what it returns can be bound, what is held is skipped, and an exhausted range says so."""
import socket

import pytest

from runtime.workers import free_ports


def hold(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", port))
    s.listen(1)
    return s


def test_consecutive_ports_skip_a_held_port_and_return_a_bindable_block():
    held = hold(15101)  # 15100 is free, but 15100..15102 is not a free block
    try:
        base = free_ports.consecutive_ports(15100, 15200, 3)
    finally:
        held.close()
    assert base == 15102
    blocks = [hold(base + i) for i in range(3)]  # all three at once
    for s in blocks:
        s.close()


def test_consecutive_ports_cursor_clamp_boundary_and_exhaustion():
    assert free_ports.consecutive_ports(15200, 15300, 1, start=1000) == 15200
    assert free_ports.consecutive_ports(15300, 15304, 4) == 15300  # the block may end at high - 1
    with pytest.raises(RuntimeError, match="consecutive free ports"):
        free_ports.consecutive_ports(15400, 15403, 5)
    with pytest.raises(RuntimeError, match="consecutive free ports"):
        free_ports.consecutive_ports(15400, 15450, 1, start=15500)
    with pytest.raises(ValueError, match="consecutive: 0 is not a whole number between 1 and 65535"):
        free_ports.consecutive_ports(15400, 15450, 0)


@pytest.mark.parametrize("low,high,fault", [(15450, 15400, "is empty"), (15400, 15400, "is empty"),
                                            (0, 100, "low: 0 is not"), (15400, 70000, "high: 70000 is not"),
                                            (15400.5, 15450, "low: '15400.5' is not a whole number"),
                                            ("15400", 15450, None), ("abc", 15450, "low: 'abc' is not")])
def test_a_port_range_is_checked_once_naming_the_bound(low, high, fault):
    """Inverted, empty, out-of-range, float or text ranges: one line naming the bound, not a raw error
    from random.randint or range()."""
    from runtime.errors import InputError
    for call in (lambda: free_ports.port_in_range(low, high), lambda: free_ports.consecutive_ports(low, high, 1)):
        if fault is None:
            assert 15400 <= call() < 15450  # digits as text are read as the number they spell
        else:
            with pytest.raises(InputError, match=fault):
                call()


def test_a_port_in_range_skips_excluded_and_held_ports():
    held = hold(15500)
    try:
        with pytest.raises(RuntimeError, match="after all 1 available ports"):  # 15500 held, 15501 excluded
            free_ports.port_in_range(15500, 15502, max_retries=None, excluded={15501})
    finally:
        held.close()
    assert 15600 <= free_ports.port_in_range(15600, 15700) < 15700
    port = free_ports.any_port()
    hold(port).close()

"""The driver's output as the head's log (runtime/cluster/log_relay.py): ANSI codes removed, Ray's
missing-metrics-agent line dropped while metrics collection is off, torch's c10d hostname warning and
gloo's all-connected count dropped, every other line kept in order."""
import io
import os

import pytest

from runtime.cluster import log_relay

GCS_LINE = (b"(pid=gcs_server) [2026-11-27 13:45:59,344 E 3546 3546] (gcs_server) gcs_server.cc:1361: Failed to "
            b"establish connection to the event+metrics exporter agent. Events and metrics will not be exported. "
            b"Exporter agent status: RpcError: Running out of retries to initialize the metrics agent. rpc_code: 14\n")
RAYLET_LINE = (b"(raylet) [2026-11-27 13:25:58,615 E 86 86] (raylet) main.cc:1108: Failed to establish connection to "
               b"the metrics exporter agent. Metrics will not be exported.\n")
OTHER = [b"\x1b[32mstep 1 loss 0.5\x1b[0m\n", b"step 2 loss 0.4\n", b"SUMMARY {}\n"]


class Keep(io.BytesIO):
    def close(self):  # the relay closes what it was given; keep the bytes readable
        pass


def relayed(lines: list[bytes]) -> bytes:
    r, w = os.pipe()
    out, err = Keep(), Keep()
    err_r, err_w = os.pipe()
    threads = log_relay.relay_fds(r, err_r, out, err)
    with os.fdopen(w, "wb") as f:
        f.writelines(lines)
    os.close(err_w)
    log_relay.finish(threads)
    return out.getvalue()


@pytest.mark.parametrize("setting", [None, "0"])
def test_the_missing_metrics_agent_line_is_dropped_while_collection_is_off(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv(log_relay.METRICS_ENV, raising=False)  # the launcher's default: off
    else:
        monkeypatch.setenv(log_relay.METRICS_ENV, setting)
    out = relayed([OTHER[0], GCS_LINE, OTHER[1], RAYLET_LINE, OTHER[2]])
    assert out == b"step 1 loss 0.5\nstep 2 loss 0.4\nSUMMARY {}\n"


def test_with_collection_on_the_line_is_a_real_fault_and_stays(monkeypatch):
    monkeypatch.setenv(log_relay.METRICS_ENV, "1")
    out = relayed([OTHER[1], GCS_LINE])
    assert out == OTHER[1] + GCS_LINE


C10D_HOSTNAME = (b"(rank1@10.0.3.4 pid=311) [W1127 13:46:02.512874154 socket.cpp:752] [c10d] The hostname of the "
                 b"client socket cannot be retrieved. err=-3\n")
GLOO_ALL = (b"(warm@127.0.0.1 pid=15297) [Gloo] Rank 1 is connected to 2 peer ranks. Expected number of connected "
            b"peer ranks is : 2 [repeated 2x across cluster] (Ray deduplicates logs by default.)\n")
GLOO_SHORT = (b"(rank2@10.0.3.5 pid=90) [Gloo] Rank 2 is connected to 1 peer ranks. Expected number of connected "
              b"peer ranks is : 2\n", b"(rank2@10.0.3.5 pid=90) [Gloo] Rank 2 is NOT connected to: [0]\n")


def test_the_c10d_hostname_warning_and_gloos_all_connected_count_are_dropped_a_missing_peer_stays():
    out = relayed([OTHER[1], C10D_HOSTNAME, GLOO_ALL, *GLOO_SHORT, OTHER[2]])
    assert out == OTHER[1] + b"".join(GLOO_SHORT) + OTHER[2]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_prefixed_lines_drop_colour_codes_off_a_terminal_and_keep_them_on_one():
    """A held `run` relays `sky exec`'s coloured lines: a pipe or a CI log gets them plain."""
    chunks = [b"\x1b[36m(head, rank=0, pid=12311)\x1b[0m step 1", b" loss 0.5\n\x1b[1mdone\x1b[0m"]
    piped, tty = io.StringIO(), _Tty()
    log_relay.prefixed(iter(chunks), "run", piped)
    log_relay.prefixed(iter(chunks), "run", tty)
    assert piped.getvalue() == "[run] (head, rank=0, pid=12311) step 1 loss 0.5\n[run] done\n"
    assert "\x1b[36m" in tty.getvalue()


def test_a_workers_empty_line_is_dropped_its_text_and_the_drivers_blank_lines_stay():
    empty = [b"(rank0@172.21.0.2 pid=112, ip=172.21.0.2) \n", b"\x1b[36m(rank2@10.0.0.4 pid=207)\x1b[0m \n",
             b"(warm@172.18.0.3 pid=108, ip=172.18.0.3)\n"]
    kept = [b"(rank0@172.21.0.2 pid=112, ip=172.21.0.2) step 20 loss 0.1\n", b"\n", b"(not a prefix) \n"]
    assert relayed([*empty, *kept]) == b"".join([b"(rank0@172.21.0.2 pid=112, ip=172.21.0.2) step 20 loss 0.1\n",
                                                 b"\n", b"(not a prefix) \n"])

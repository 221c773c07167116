"""output_flush: the workers' lines reach the driver's streams before flush_output returns."""
import io

import pytest

from runtime.workers import output_flush


def _filter():
    real, seen = io.StringIO(), []
    return real, seen, output_flush.MarkerFilter(real, "stdout", lambda *m: seen.append(m))


TOK, OTHER = "ghijklmnopqr", "rqponmlkjihg"


def test_filter_passes_whole_lines_and_leaves_out_markers():
    real, seen, f = _filter()
    f.write("(rank0@n pid=1) step 1")
    assert real.getvalue() == ""  # held until the line ends
    f.write(f" loss 0.5\n(rank1@n pid=2) raytrain-output-mark {TOK} h")  # rank 1's marker, its word "h"
    assert real.getvalue() == "(rank0@n pid=1) step 1 loss 0.5\n" and seen == []
    f.write(f"\n(rank0@n pid=1) raytrain-output-mark {OTHER} g\n(rank0@n pid=1) raytrain-output-mark 12 g\n")
    assert seen == [(TOK, "h", "stdout"), (OTHER, "g", "stdout")]  # digits are no token: shown
    f.write("tail without end")
    f.release()
    assert real.getvalue() == ("(rank0@n pid=1) step 1 loss 0.5\n(rank0@n pid=1) raytrain-output-mark 12 g\n"
                               "tail without end")


def test_a_user_line_that_holds_the_marker_words_is_shown():
    real, seen, f = _filter()
    lines = [f"(rank0@n pid=1) echo raytrain-output-mark {TOK} g\n",            # words before it
             f"(rank0@n pid=1) raytrain-output-mark {TOK} g and more\n",        # words after it
             f"(rank0@n pid=1) raytrain-output-mark {TOK[:-1]} g\n",           # a token too short
             f"raytrain-output-mark {TOK} g ; rm -rf x\n"]
    f.write("".join(lines))
    assert seen == [] and real.getvalue() == "".join(lines)
    f.write(f"\x1b[36m(rank2@n pid=7)\x1b[0m raytrain-output-mark {TOK} i\n")  # Ray's colored prefix
    assert seen == [(TOK, "i", "stdout")]


def test_output_without_a_newline_is_held_back_only_so_long():
    real, seen, f = _filter()
    chunk = "x" * 4096
    for _ in range(100):  # 400 KiB, no newline: it goes out as it comes, not into memory
        f.write(chunk)
    assert len(real.getvalue()) >= 100 * 4096 - output_flush.MAX_HELD and len(f._buf) <= output_flush.MAX_HELD


def test_markers_of_two_ranks_differ_in_letters_not_digits():
    import re
    a, b = output_flush.marker(TOK, 1), output_flush.marker(TOK, 12)
    assert a != b and re.sub(r"\d", "", a) != re.sub(r"\d", "", b) and not re.search(r"\d", a + b)
    assert output_flush.parse("(x pid=3) " + b) == (TOK, "hi")
    token = output_flush.new_token()
    assert output_flush.parse(output_flush.marker(token, 3) + "\n") == (token, "j") and token != output_flush.new_token()


@pytest.mark.cluster
def test_flush_output_shows_every_rank_line_first(two_nodes, capsys, monkeypatch):
    # as the launcher runs every driver (RAY_DEDUP_LOGS=0): Ray's deduplication holds repeated lines back
    monkeypatch.setattr("ray._private.ray_logging.RAY_DEDUP_LOGS", False)
    from helpers.workers import Plain
    from runtime.workers.virtual_cluster import RayVirtualCluster
    from runtime.workers.worker_group import RayWorkerGroup
    vc = RayVirtualCluster([2, 2])
    g = RayWorkerGroup(vc, Plain, backend=None)
    try:
        capsys.readouterr()
        assert g.run_all_workers_single_data("say", 40) == [40] * 4
        assert g.flush_output(timeout_s=60) == []
        seen = capsys.readouterr()
        for rank in range(4):
            assert f"said 39 by {rank}" in seen.out, seen.out[-2000:]
            assert f"err said by {rank}" in seen.err, seen.err[-2000:]
            assert sum(f"said {i} by {rank}\n" in seen.out for i in range(40)) == 40
        assert output_flush.MARK not in seen.out + seen.err
    finally:
        g.shutdown()
        vc.shutdown()

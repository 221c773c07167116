"""output_flush: the workers' lines reach the driver's streams before flush_output returns."""
import io

import pytest

from runtime.workers import output_flush


def _filter():
    real, seen = io.StringIO(), []
    return real, seen, output_flush.MarkerFilter(real, "stdout", lambda *m: seen.append(m))


def test_filter_passes_whole_lines_and_leaves_out_markers():
    real, seen, f = _filter()
    f.write("(rank0@n pid=1) step 1")
    assert real.getvalue() == ""  # held until the line ends
    f.write(" loss 0.5\n(rank1@n pid=2) raytrain-output-mark tok h")  # rank 1's marker, its word "h"
    assert real.getvalue() == "(rank0@n pid=1) step 1 loss 0.5\n" and seen == []
    f.write("\n(rank0@n pid=1) raytrain-output-mark other g\n(rank0@n pid=1) raytrain-output-mark 12 g\n")
    assert seen == [("tok", "h", "stdout"), ("other", "g", "stdout")]  # digits are no token: shown
    f.write("tail without end")
    f.release()
    assert real.getvalue() == ("(rank0@n pid=1) step 1 loss 0.5\n(rank0@n pid=1) raytrain-output-mark 12 g\n"
                               "tail without end")


def test_markers_of_two_ranks_differ_in_letters_not_digits():
    import re
    a, b = output_flush.marker("tok", 1), output_flush.marker("tok", 12)
    assert a != b and re.sub(r"\d", "", a) != re.sub(r"\d", "", b) and not re.search(r"\d", a + b)
    assert output_flush.parse("(x pid=3) " + b) == ("tok", "hi")


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

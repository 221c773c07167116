"""output_flush: the workers' lines reach the driver's streams before flush_output returns."""
import io

import pytest

from runtime.workers import output_flush


def _watch(ranks=(0, 1)):
    real = io.StringIO()
    watch = output_flush._Watch(real, "tok", {output_flush._word(str(r)): r for r in ranks})
    return real, watch


def test_watch_passes_whole_lines_and_leaves_out_only_its_own_markers():
    real, watch = _watch()
    watch.write("(rank0@n pid=1) step 1")
    assert real.getvalue() == ""  # held until the line ends
    watch.write(" loss 0.5\n(rank1@n pid=2) raytrain-output-mark tok h")  # rank 1's marker, its word "h"
    assert real.getvalue() == "(rank0@n pid=1) step 1 loss 0.5\n" and watch.pending == {0, 1}
    watch.write("\n(rank0@n pid=1) raytrain-output-mark other g\n")  # another flush's marker: shown
    assert watch.pending == {0} and not watch.done.is_set()
    watch.write("(rank0@n pid=1) raytrain-output-mark tok g\ntail without end")
    assert watch.done.is_set() and watch.pending == set()
    watch.release()
    assert real.getvalue() == ("(rank0@n pid=1) step 1 loss 0.5\n(rank0@n pid=1) raytrain-output-mark other g\n"
                               "tail without end")


def test_markers_of_two_ranks_differ_in_letters_not_digits():
    import re
    a, b = output_flush.marker("tok", 1), output_flush.marker("tok", 12)
    assert a != b and re.sub(r"\d", "", a) != re.sub(r"\d", "", b) and not re.search(r"\d", a + b)


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

"""Worker groups on a real multi-raylet Ray cluster (ray.cluster_utils.Cluster, two nodes)."""
from pathlib import Path

import pytest
import torch

from runtime.workers.batched import BatchedDataDict
from runtime.wait import wait_until
from runtime.workers.virtual_cluster import RayVirtualCluster
from runtime.workers.worker_group import RayWorkerGroup, WorkerFailureError, WorkerGroupRestarted

pytestmark = pytest.mark.cluster  # starts real Ray nodes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture
def vc(two_nodes):
    c = RayVirtualCluster([2, 2], max_colocated_worker_groups=2)
    yield c
    c.shutdown()


def test_ranks_env_and_allreduce(vc):
    from helpers.workers import EnvReporter
    g = RayWorkerGroup(vc, EnvReporter)
    envs = g.run_all_workers_single_data("env")
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert g.run_all_workers_single_data("allreduce_rank") == [6.0] * 4
    assert g.run_all_workers_multiple_data("echo", ["a", "b", "c", "d"]) == ["a", "b", "c", "d"]
    data = BatchedDataDict({"x": torch.arange(8).float(), "id": list(range(8))})
    out = g.run_all_workers_sharded_batch("shard_sum", data)
    assert [o["ids"] for o in out] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    st = g.get_worker_status()
    assert [s["state"] for s in st] == ["idle"] * 4
    g.shutdown()


def test_colocated_groups_share_bundles(vc):
    from helpers.workers import EnvReporter
    a = RayWorkerGroup(vc, EnvReporter, init_kwargs={"tag": "a"})
    b = RayWorkerGroup(vc, EnvReporter, init_kwargs={"tag": "b"})
    ea, eb = a.run_all_workers_single_data("env"), b.run_all_workers_single_data("env")
    assert [e["tag"] for e in ea] == ["a"] * 4 and [e["tag"] for e in eb] == ["b"] * 4
    assert ea[0]["MASTER_PORT"] != eb[0]["MASTER_PORT"]
    a.shutdown()
    b.shutdown()


def test_restart_whole_group_then_give_up(vc):
    from helpers.workers import EnvReporter
    g = RayWorkerGroup(vc, EnvReporter, restart_on_failure=True, max_restarts=1)
    before = g.run_all_workers_single_data("env")
    with pytest.raises(WorkerGroupRestarted) as e:
        g.run_all_workers_single_data("crash_if", 2)
    assert e.value.rank == 2
    after = g.run_all_workers_single_data("env")
    assert {x["RAYTRAIN_RESTARTS"] for x in after} == {"1"}
    assert not {x["pid"] for x in after} & {x["pid"] for x in before}, "the whole group must be new processes"
    assert g.run_all_workers_single_data("allreduce_rank") == [6.0] * 4
    with pytest.raises(WorkerFailureError, match=r"worker rank 1 on .* failed after 1 restarts") as e:
        g.run_all_workers_single_data("crash_if", 1)
    assert not isinstance(e.value, WorkerGroupRestarted)
    assert "last log lines of rank 1" in str(e.value) and "about to crash on rank 1" in str(e.value)
    g.shutdown()


def test_stuck_worker_times_out(vc):
    from helpers.workers import EnvReporter
    g = RayWorkerGroup(vc, EnvReporter, call_timeout_s=2)
    refs = [w.execute.remote("sleep", 30) for w in g.workers[:1]]
    # the call may not have started when the first status answers: wait for it to
    st = wait_until(lambda: (lambda s: s if s[0]["state"] == "busy" else None)(g.get_worker_status(timeout_s=5)),
                    timeout_s=15, what="rank 0 to be busy")
    assert st[0]["busy"] == "sleep"
    with pytest.raises(WorkerFailureError, match="stuck"):
        g.run_all_workers_single_data("sleep", 30)
    del refs
    g.shutdown()

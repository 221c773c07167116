"""The seed's worker-group API, point by point, on a two-raylet ray.cluster_utils.Cluster."""
import asyncio
import time

import pytest
import ray
import torch

from runtime.workers.batched import BatchedDataDict
from runtime.workers.virtual_cluster import RayVirtualCluster, gpu_assignment
from runtime.workers.failures import WorkerFailureError
from runtime.workers.worker_group import RayWorkerGroup, gather_futures

pytestmark = pytest.mark.cluster  # starts real Ray nodes


@pytest.fixture
def vc(two_nodes):
    c = RayVirtualCluster([2, 2], enable_colocation=True)
    yield c
    c.shutdown()


def test_cluster_is_nemo_compatible(vc):
    assert vc.world_size() == 4 and vc.node_count() == 2 and vc.max_colocated_worker_groups == 2
    addr, port = vc.get_master_address_and_port()
    assert addr and 0 < port < 65536
    assert vc.communication_backend == "gloo"  # chosen by device: no GPUs here


def test_colocated_groups_take_turns_on_the_same_bundles(vc):
    from helpers.workers import EnvReporter
    a = RayWorkerGroup(vc, EnvReporter, init_kwargs={"tag": "policy"})
    b = RayWorkerGroup(vc, EnvReporter, init_kwargs={"tag": "generation"})
    assert [e["tag"] for e in a.run_all_workers_single_data("env")] == ["policy"] * 4
    assert [e["tag"] for e in b.run_all_workers_single_data("env")] == ["generation"] * 4
    assert a.run_all_workers_single_data("allreduce_rank") == b.run_all_workers_single_data("allreduce_rank") == [6.0] * 4
    a.shutdown()
    b.shutdown()


def test_a_group_after_shutdown_refuses_work_instead_of_returning_nothing(vc):
    from helpers.workers import EnvReporter
    from runtime.workers.worker_group import WorkerGroupClosed
    g = RayWorkerGroup(vc, EnvReporter, init_kwargs={"tag": "x"})
    assert len(g.run_all_workers_single_data("env")) == 4
    g.shutdown()
    with pytest.raises(WorkerGroupClosed, match="shut down"):
        g.run_all_workers_single_data("env")
    with pytest.raises(WorkerGroupClosed):
        g.run_work_items("env", [1, 2])


def test_options_without_an_honest_meaning_here_are_clear_errors(two_nodes):
    with pytest.raises(ValueError, match='"nccl" needs GPUs'):
        RayVirtualCluster([1], communication_backend="nccl", use_gpus=False)
    with pytest.raises(ValueError, match="gpu_ids pins bundles to GPUs"):
        RayVirtualCluster([1], gpu_ids=[0], use_gpus=False)


def test_gpu_ids_placement_logic():
    assert gpu_assignment([2, 2], [[0, 1], [2, 3]]) == [[0, 1], [2, 3]]
    assert gpu_assignment([4], [0, 1, 2, 3]) == [[0, 1, 2, 3]]
    assert gpu_assignment([2], "auto") == [[None, None]]
    for bad, msg in (([[0, 1]], "1 node list"), ([[0, 0], [1, 2]], "distinct"), ("all", "not a list")):
        with pytest.raises(ValueError, match=msg):
            gpu_assignment([2, 2], bad)


@pytest.fixture
def clusters(two_nodes):
    """RayVirtualCluster(...) for a test, each shut down after it, passed or failed: the module's Ray
    cluster outlives the test, and a cluster left alive would hold its name for the next."""
    made = []

    def make(*args, **kwargs):
        made.append(RayVirtualCluster(*args, **kwargs))
        return made[-1]
    yield make
    for c in made:
        c.shutdown()


def test_memory_limit_is_enforced_on_a_cluster_without_reservations(clusters):
    """The seed's memory_limit on a cluster made as the seed makes it (no memory reserved): accepted,
    a worker within it runs, one over it is stopped and the error names the rank, limit and peak."""
    from helpers.workers import Plain
    from runtime.workers.failures import WorkerFailureError
    plain = clusters([1, 1])
    g = RayWorkerGroup(plain, Plain, backend=None, memory_limit="1GB")
    assert g.run_all_workers_single_data("hold", 64, 0.2) == [64, 64]
    with pytest.raises(WorkerFailureError, match=r"memory_limit exceeded: rank 1 .* MiB RSS \(peak\), over its "
                                                 r"memory_limit of 1024 MiB") as err:
        g.run_work_items("hold", [8, 1536])  # item 1 to worker 1
    assert err.value.rank == 1
    g.shutdown()


def test_reserved_memory_limit(clusters):
    from helpers.workers import EnvReporter
    reserved = clusters([1, 1], memory_per_bundle="1GiB")
    with pytest.raises(ValueError, match="memory_limit 8.00 GiB cannot be met.*memory_per_bundle"):
        RayWorkerGroup(reserved, EnvReporter, memory_limit="8GB")
    g = RayWorkerGroup(reserved, EnvReporter, memory_limit="1GiB")
    assert len(g.run_all_workers_single_data("env")) == 2
    g.shutdown()


def test_a_second_cluster_of_a_name_in_use_is_refused_and_takes_nothing(clusters):
    from ray.util.placement_group import placement_group_table
    first = clusters([1, 1], name="policy")
    before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    with pytest.raises(ValueError, match=r"name: 'policy' is taken in this Ray cluster .*policy-node0.*"
                                         r"shutdown\(\) first, or give this one another name="):
        RayVirtualCluster([1, 1], name="policy")
    assert {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} == before
    assert first.world_size() == 2 and len(first.get_placement_groups()) == 2
    first.shutdown()
    again = clusters([1, 1], name="policy")  # the name is free once its cluster is shut down
    assert again.world_size() == 2


def test_a_worker_dying_in_run_work_items_is_reported_as_its_own_rank(vc):
    """Item 2 goes to worker 2 (round robin), which dies: the error names rank 2, not rank 0."""
    from helpers.workers import Plain
    from runtime.workers.failures import WorkerFailureError
    g = RayWorkerGroup(vc, Plain, backend=None)
    with pytest.raises(WorkerFailureError, match="worker rank 2 on") as err:
        g.run_work_items("crash_on", ["a", "b", "boom", "c"], strategy="round_robin")
    assert err.value.rank == 2
    g.shutdown()


def test_a_cluster_collected_without_shutdown_frees_its_placement_groups(two_nodes):
    import gc
    from ray.util.placement_group import placement_group_table
    c = RayVirtualCluster([1, 1], name="collected")
    ids = [pg.id.hex() for pg in c.get_placement_groups()]
    del c
    gc.collect()
    assert all(placement_group_table()[i]["state"] == "REMOVED" for i in ids)
    again = RayVirtualCluster([1, 1], name="collected")  # the names are free again
    assert again.world_size() == 2
    assert again.shutdown() is True


def test_resource_usage_and_stuck_workers(vc):
    from helpers.workers import EnvReporter
    g = RayWorkerGroup(vc, EnvReporter, async_communication=True)
    usage = g.get_resource_usage()
    assert [u["rank"] for u in usage] == [0, 1, 2, 3]
    assert all(u["rss_bytes"] > 10 << 20 and u["peak_rss_bytes"] >= u["rss_bytes"] * 0.5 for u in usage)
    assert all("cpu_percent" in u for u in usage)
    future = g.run_all_workers_single_data("sleep", 3)
    time.sleep(1.5)
    stuck = g.detect_stuck_workers(threshold_s=1)
    assert sorted(s["rank"] for s in stuck) == [0, 1, 2, 3] and {s["method"] for s in stuck} == {"sleep"}
    assert g.detect_stuck_workers(threshold_s=60) == []
    assert future.result() == [3] * 4
    g.shutdown()


def test_futures_combine_across_two_groups_and_await(vc):
    from helpers.workers import EnvReporter
    a = RayWorkerGroup(vc, EnvReporter, async_communication=True)
    b = RayWorkerGroup(vc, EnvReporter, async_communication=True)
    fa, fb = a.run_all_workers_multiple_data("echo", [1, 2, 3, 4]), b.run_all_workers_single_data("echo", "x")
    assert gather_futures(fa, fb) == [[1, 2, 3, 4], ["x"] * 4]

    async def main():
        return await a.run_all_workers_single_data("echo", 5)
    assert asyncio.run(main()) == [5] * 4
    a.shutdown()
    b.shutdown()


def test_restart_failed_workers_whole_group_with_collectives_continues_from_checkpoint(vc, tmp_path):
    from helpers.workers import Checkpointed
    ckpt = str(tmp_path / "step")
    g = RayWorkerGroup(vc, Checkpointed, init_args=(ckpt,), restart_on_failure=True, max_restarts=1)
    assert g.run_all_workers_single_data("train_step") == [1] * 4
    assert g.run_all_workers_single_data("train_step") == [2] * 4
    before = g.run_all_workers_single_data("pid")
    ray.kill(g.workers[3], no_restart=True)
    time.sleep(1)
    assert g.restart_failed_workers() == [3]
    after = g.run_all_workers_single_data("pid")
    assert not set(before) & set(after), "with a process group the whole group restarts"
    assert g.run_all_workers_single_data("train_step") == [3] * 4  # resumed from the checkpoint
    g.shutdown()


def test_restart_failed_workers_only_the_dead_without_collectives(vc):
    from helpers.workers import Plain
    g = RayWorkerGroup(vc, Plain, backend=None, restart_on_failure=True, max_restarts=1)
    before = g.run_all_workers_single_data("pid")
    ray.kill(g.workers[1], no_restart=True)
    time.sleep(1)
    assert g.restart_failed_workers() == [1]
    after = g.run_all_workers_single_data("pid")
    assert after[0] == before[0] and after[2:] == before[2:] and after[1] != before[1]
    # the failure detector's view names the new process (its log is the one a later failure shows)
    assert [p.pid for p in g.failure_view().processes] == after
    # the group's one restart is spent: the next dead worker stays dead, and the group says so
    ray.kill(g.workers[2], no_restart=True)
    time.sleep(1)
    with pytest.raises(WorkerFailureError, match=r"used its 1 restart\(s\)"):
        g.restart_failed_workers()
    assert g.restarts == 1
    g.shutdown()


def test_a_group_without_restart_on_failure_restarts_nothing_when_asked(vc):
    from helpers.workers import Plain
    g = RayWorkerGroup(vc, Plain, backend=None, max_restarts=3)
    with pytest.raises(WorkerFailureError, match="without restart_on_failure=True"):
        g.restart_failed_workers()
    assert g.restarts == 0
    g.shutdown()


def test_least_loaded_finishes_a_skewed_list_sooner_than_round_robin(vc):
    from helpers.workers import Plain
    g = RayWorkerGroup(vc, Plain, backend=None, enable_load_balancing=True)
    items = [1.0, 0.05, 0.05, 0.05, 1.0, 0.05, 0.05, 0.05]
    t0 = time.monotonic()
    assert g.run_work_items("sleep", items, strategy="round_robin") == items
    rr = time.monotonic() - t0
    t0 = time.monotonic()
    assert g.run_work_items("sleep", items) == items  # least_loaded, from enable_load_balancing
    ll = time.monotonic() - t0
    assert ll < rr - 0.5, (ll, rr)
    g.shutdown()


@pytest.mark.parametrize("kind", ["fp16", "powersgd"])
def test_gradient_compression_registers_a_ddp_comm_hook(vc, kind):
    from helpers.workers import DDPWorker
    g = RayWorkerGroup(vc, DDPWorker, enable_gradient_compression=kind)
    out = [g.run_all_workers_single_data("step") for _ in range(3)][-1]
    assert {o["kind"] for o in out} == {kind}
    assert len({round(o["w0"], 6) for o in out}) == 1  # gradients averaged across ranks: same weights
    g.shutdown()


def test_batched_to_device():
    b = BatchedDataDict({"x": torch.ones(4, 2), "ids": [1, 2, 3, 4]})
    moved = b.to_device(torch.device("cpu"))
    assert moved["x"].device.type == "cpu" and moved["ids"] == [1, 2, 3, 4] and isinstance(moved, BatchedDataDict)

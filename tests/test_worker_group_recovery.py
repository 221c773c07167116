"""A node lost under a worker group (its raylet and every process on it killed, as when a container
or machine dies), on a ray.cluster_utils.Cluster: the group finds the silent rank itself, moves that
node's placement group to another node without waiting for Ray to declare the node dead, takes its
new workers from the spares, and training continues from the checkpoint."""
import psutil
import pytest
import ray

from runtime.virtual_cluster import RayVirtualCluster
from runtime.worker_group import RayWorkerGroup, WorkerGroupRestarted


def kill_node(cluster, node) -> None:
    """SIGKILL the node's raylet and every process it started, then drop it from the cluster."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for p in raylet.children(recursive=True):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    cluster.remove_node(node, allow_graceful=False)


@pytest.fixture
def three_nodes(two_nodes):
    extra = two_nodes.add_node(num_cpus=2)
    two_nodes.wait_for_nodes()
    yield two_nodes, extra
    if extra in two_nodes.worker_nodes:
        two_nodes.remove_node(extra, allow_graceful=False)


def test_node_lost_group_moves_and_resumes_from_spares(three_nodes, tmp_path):
    from helpers.workers import Checkpointed
    cluster, _ = three_nodes
    # 1.5 CPUs a bundle: one per node, so the lost node's bundle can only go to the one free node
    vc = RayVirtualCluster([1, 1], num_cpus_per_bundle=1.5)
    g = RayWorkerGroup(vc, Checkpointed, init_args=(str(tmp_path / "step"),), restart_on_failure=True,
                       max_restarts=1, spare_workers=True)
    try:
        assert g.run_all_workers_single_data("train_step") == [1, 1]
        assert g.run_all_workers_single_data("train_step") == [2, 2]
        head = ray.get_runtime_context().get_node_id()
        victim = next(r for r, s in enumerate(g.slots) if s.node_id != head)
        lost = g.slots[victim].node_id
        node = next(n for n in cluster.worker_nodes if n.node_id == lost)
        before = set(g.run_all_workers_single_data("pid"))
        kill_node(cluster, node)
        with pytest.raises(WorkerGroupRestarted, match="its node is lost") as e:
            g.run_all_workers_single_data("train_step")
        assert e.value.rank == victim
        r = g.last_restart
        assert r["moved_groups"] == 1 and g.slots[victim].node_id not in (lost, "")
        assert r["spares_used"] == 2 and r["new_hosts"] == 0, r
        after = g.run_all_workers_single_data("pid")
        assert not before & set(after), "every rank is a new process"
        resumed = g.run_all_workers_single_data("train_step")
        assert len(set(resumed)) == 1 and resumed[0] in (3, 4), resumed  # from the checkpoint (2, or 3 if rank 0 wrote it)
    finally:
        g.shutdown()
        vc.shutdown()

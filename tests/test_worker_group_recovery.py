"""A node lost under a worker group (its raylet and every process on it killed, as when a container
or machine dies), on a ray.cluster_utils.Cluster: the group finds the silent rank itself, moves that
node's placement group to another node without waiting for Ray to declare the node dead, takes its
new workers from the spares, and training continues from the checkpoint."""
import psutil
import pytest
import ray

from runtime.workers.virtual_cluster import RayVirtualCluster
from runtime.wait import wait_until
from runtime.workers.worker_group import RayWorkerGroup, WorkerGroupRestarted

pytestmark = pytest.mark.cluster  # starts real Ray nodes


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
    two_nodes.add_node(num_cpus=2)
    two_nodes.wait_for_nodes()
    yield two_nodes
    # back to two nodes for the module's other tests, whichever node the test killed
    while len(two_nodes.worker_nodes) > 1:
        two_nodes.remove_node(two_nodes.worker_nodes[-1], allow_graceful=False)
    if not two_nodes.worker_nodes:
        two_nodes.add_node(num_cpus=2)
    two_nodes.wait_for_nodes()


def test_node_lost_group_moves_and_resumes_from_spares(three_nodes, tmp_path):
    from helpers.workers import Checkpointed
    cluster = three_nodes
    # 1.5 CPUs a bundle: one per node, so the lost node's bundle can only go to the one free node
    vc = RayVirtualCluster([1, 1], num_cpus_per_bundle=1.5)
    g = RayWorkerGroup(vc, Checkpointed, init_args=(str(tmp_path / "step"),), restart_on_failure=True,
                       max_restarts=1, spare_workers=True)
    try:
        assert g.spares.count() == 0  # spares start after the first call, not beside the first step
        assert g.run_all_workers_single_data("train_step") == [1, 1]
        assert g.spares.count() > 0
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


def test_group_adopts_the_launchers_warm_hosts_once(two_nodes):
    """Hosts warmed up (as the launcher does while its barrier waits) become the first group's ranks;
    a second group finds them taken and starts its own."""
    from helpers.workers import EnvReporter
    from runtime.workers.host_pool import WARM_NAMESPACE, warm_up
    nodes = [two_nodes.head_node.node_id] + [n.node_id for n in two_nodes.worker_nodes]
    held = [h for node in nodes for h in warm_up(node, 1)]
    # the names are registered with the GCS asynchronously: wait until both are listed
    listed = lambda: {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)  # noqa: E731
                      if a["namespace"] == WARM_NAMESPACE} >= {f"{n}-0" for n in nodes}
    wait_until(listed, timeout_s=60, what="the warm hosts' names")
    warm = [ray.get_actor(f"{node}-0", namespace=WARM_NAMESPACE) for node in nodes]
    warm_pids = {s["pid"] for s in ray.get([h.status.remote() for h in warm])}
    vc = RayVirtualCluster([1, 1], num_cpus_per_bundle=1.5, max_colocated_worker_groups=2)  # one bundle per node
    a = RayWorkerGroup(vc, EnvReporter)
    b = RayWorkerGroup(vc, EnvReporter)
    try:
        assert a.last_start["spares_used"] == 2 and a.last_start["new_hosts"] == 0
        assert {e["pid"] for e in a.run_all_workers_single_data("env")} == warm_pids
        assert b.last_start["spares_used"] == 0 and b.last_start["new_hosts"] == 2
        assert a.run_all_workers_single_data("allreduce_rank") == [1.0, 1.0]
    finally:
        a.shutdown()
        b.shutdown()
        vc.shutdown()

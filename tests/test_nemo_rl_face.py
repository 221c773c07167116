"""runtime.nemo_rl: NeMo RL's virtual cluster and worker groups on the core, on two raylets (2 CPUs each).

The worker classes live here; the workers import this module by name (tests/ is on their PYTHONPATH), so
it imports nothing heavy (no torch: the batch classes are checked in the driver only)."""
import ast
import gc
import os
import sys
import time
from types import SimpleNamespace

import pytest
import ray
from ray.util.placement_group import placement_group_table

import runtime.nemo_rl.virtual_cluster as nrl_vc
from runtime.nemo_rl.named_sharding import NamedSharding
from runtime.nemo_rl.ray_actor_environment_registry import (ACTOR_ENVIRONMENT_REGISTRY, PY_EXECUTABLES,
                                                            get_actor_python_env)
from runtime.nemo_rl.virtual_cluster import RayVirtualCluster, ResourceInsufficientError
from runtime.nemo_rl.worker_groups import MultiWorkerFuture, RayWorkerBuilder, RayWorkerGroup

pytestmark = pytest.mark.cluster  # starts real Ray nodes

RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
             "AVAILABLE_ADDR_LIST", "AVAILABLE_PORT_LIST")
LAYER_VARS = ("FACE_SYSTEM", "FACE_GROUP", "FACE_SHARED", "FACE_LAYER", "FACE_REMOTE_ONLY", "FACE_OVERRIDE")


class Recorder:
    """A plain class (the builder makes it an actor); NeMo RL's older three-value configure_worker."""

    def __init__(self, *args, marker_dir=None, slow_rank=-1, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.marker_dir, self.slow_rank = marker_dir, slow_rank
        self.calls = []

    def env(self, names):
        return {n: os.environ.get(n) for n in names}

    def init_seen(self):
        return self.args, self.kwargs

    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), ctx.get_placement_group_id()

    def take(self, **kw):
        self.calls.append(kw)
        return int(os.environ["RANK"]), kw

    def bye(self):
        rank = int(os.environ["RANK"])
        if rank == self.slow_rank:
            time.sleep(60)
        open(os.path.join(self.marker_dir, f"bye-{rank}"), "w").close()
        return rank

    @staticmethod
    def configure_worker(num_gpus, bundle_indices):
        return {"num_gpus": num_gpus}, {"FACE_SHARED": "configure_worker"}, {"leader_of": bundle_indices}


@ray.remote(runtime_env={"env_vars": {"FACE_LAYER": "ray_remote", "FACE_REMOTE_ONLY": "ray_remote",
                                      "FACE_SYSTEM": "ray_remote"}})
class TiedRecorder(Recorder):
    """A @ray.remote class with the four-value hook that takes num_gpus_per_node."""

    @classmethod
    def configure_worker(cls, num_gpus, bundle_indices=None, num_gpus_per_node=None):
        return ({"num_gpus": num_gpus}, {"FACE_LAYER": "configure_worker"},
                {"leader_of": bundle_indices, "gpus_per_node": num_gpus_per_node},
                {"env_vars": {"FACE_OVERRIDE": "runtime_env_override"}})


class Lifecycle:
    """A worker whose setup (__init__) leaves one line per run in init-<RANK>, and which can die in the
    middle of a call: os._exit on rank `die_on_rank`, after `after_s` seconds of the call."""

    def __init__(self, marker_dir):
        self.marker_dir = marker_dir
        with open(os.path.join(marker_dir, f"init-{os.environ['RANK']}"), "a") as f:
            f.write(f"{os.getpid()}\n")

    def env(self, names):
        return {n: os.environ.get(n) for n in names}

    def step(self, x, die_on_rank=-1, after_s=0.0):
        open(os.path.join(self.marker_dir, f"running-{os.environ['RANK']}"), "w").close()
        time.sleep(after_s)
        if int(os.environ["RANK"]) == die_on_rank:
            os._exit(1)
        return int(os.environ["RANK"]), x

    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), ctx.get_placement_group_id()


def bundles_held(pg) -> set:
    """The bundles of placement group `pg` that an actor sits in (each takes 0.001 of its bundle's
    bundle_group_<i>_<pg> resource)."""
    free = ray.available_resources()
    return {i for i in range(pg.bundle_count) if free.get(f"bundle_group_{i}_{pg.id.hex()}", 1000) < 1000}


def state_of(name: str) -> list:
    return [pg["state"] for pg in placement_group_table().values() if pg["name"] == name]


def wait_removed(name: str, timeout_s: float = 15) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(s != "REMOVED" for s in state_of(name)):
        time.sleep(0.2)
    return state_of(name)


def dead(actor, timeout_s: float = 20) -> bool:
    """ray.kill lands asynchronously: True once a call on `actor` fails as on a dead actor."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.env.remote(["RANK"]), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


# -- the cluster ------------------------------------------------------------------------------------------
def test_placement_retries_with_backoff_then_gives_up(two_nodes, monkeypatch):
    slept = []
    monkeypatch.setattr(nrl_vc, "time", SimpleNamespace(sleep=slept.append))
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "3")
    too_big = RayVirtualCluster([9], use_gpus=False, name="nrl-face-big")  # 9 CPUs of 4
    with pytest.raises(ResourceInsufficientError, match="Maximum number of retries reached \\(3\\)"):
        too_big.get_placement_groups()
    assert slept == [1, 2, 4] and state_of("nrl-face-big-node0") == []
    slept.clear()
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "1")
    with pytest.raises(ResourceInsufficientError):  # NeMo RL's default: one GPU per bundle; there are none
        RayVirtualCluster([1])._init_placement_groups()
    assert slept == [1]
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "0")
    with pytest.raises(AssertionError):
        RayVirtualCluster([1], use_gpus=False)._init_placement_groups()
    with pytest.raises(NotImplementedError, match="use_unified_pg"):
        RayVirtualCluster([1], use_gpus=False)._create_placement_groups_internal(None, use_unified_pg=True)
    with pytest.raises(NotImplementedError, match="NVLink"):
        RayVirtualCluster([1], segment_size=2)


def test_a_cluster_deleted_without_shutdown_frees_its_placement_groups(two_nodes):
    first = RayVirtualCluster([2, 2], use_gpus=False, name="nrl-face-gc")
    assert state_of("nrl-face-gc-node0") == []  # nothing placed before first use
    assert len(first.get_placement_groups()) == 2 and state_of("nrl-face-gc-node0") == ["CREATED"]
    del first
    gc.collect()
    assert set(wait_removed("nrl-face-gc-node0") + wait_removed("nrl-face-gc-node1")) == {"REMOVED"}
    second = RayVirtualCluster([2, 2], use_gpus=False, name="nrl-face-gc")  # all 4 CPUs again, same names
    assert len(second.get_placement_groups()) == 2
    assert second.shutdown() is True and second.shutdown() is True
    assert "CREATED" not in wait_removed("nrl-face-gc-node0")
    assert len(second.get_placement_groups()) == 2  # used again after shutdown: placed again, as in NeMo RL
    del second
    gc.collect()
    assert "CREATED" not in wait_removed("nrl-face-gc-node0") + wait_removed("nrl-face-gc-node1")


@pytest.fixture(scope="module")
def cluster(two_nodes):
    c = RayVirtualCluster([2, 2], use_gpus=False, name="nrl-face")
    yield c
    c.shutdown()


def test_cluster_maps_nemo_rl_onto_the_core(cluster):
    assert cluster.world_size() == 4 and cluster.node_count() == 2 and state_of("nrl-face-node0") == []
    (addr, p1), (_, p2) = cluster.get_master_address_and_port(), cluster.get_master_address_and_port()
    assert addr and p1 != p2 and all(1400 <= p < 1999 for p in (p1, p2))
    ip, port = cluster.get_available_address_and_port(1, 1)
    assert ip and 1400 <= port < 1999
    pgs = cluster.get_placement_groups()
    slots = cluster.slots()  # the core's, in node order
    assert [(s.node_rank, s.bundle_index) for s in slots] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [s.placement_group.id for s in slots] == [pgs[0].id] * 2 + [pgs[1].id] * 2
    assert len({s.node_id for s in slots}) == 2  # one placement group per raylet
    assert all(b == {"CPU": 1.0} for pg in pgs for b in pg.bundle_specs)


def test_module_paths_mirror_nemo_rl():
    import runtime.workers.batched
    import runtime.workers.named_sharding
    from runtime.nemo_rl import batched_data_dict, named_sharding
    assert batched_data_dict.BatchedDataDict is runtime.workers.batched.BatchedDataDict
    assert batched_data_dict.SlicedDataDict is runtime.workers.batched.SlicedDataDict
    assert named_sharding.NamedSharding is runtime.workers.named_sharding.NamedSharding is NamedSharding


def test_registry_has_one_interpreter(cluster):
    assert get_actor_python_env("anything.not.Registered") == PY_EXECUTABLES.SYSTEM == sys.executable
    assert PY_EXECUTABLES.VLLM == PY_EXECUTABLES.MCORE == sys.executable
    fqn = f"{__name__}.Recorder"
    ACTOR_ENVIRONMENT_REGISTRY[fqn] = "uv run --extra vllm"
    try:
        with pytest.raises(ValueError, match="does not build"):
            RayWorkerGroup(cluster, RayWorkerBuilder(fqn))
    finally:
        del ACTOR_ENVIRONMENT_REGISTRY[fqn]


# -- one worker per bundle, 2-D sharding ------------------------------------------------------------------
@pytest.fixture(scope="class")
def flat(cluster, tmp_path_factory):
    marks = tmp_path_factory.mktemp("flat")
    saved = {k: os.environ.get(k) for k in ("FACE_SYSTEM", "FACE_SHARED", "FACE_GROUP")}
    os.environ.update(FACE_SYSTEM="system", FACE_SHARED="system", FACE_GROUP="system")
    try:
        group = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Recorder", "a", k=1, marker_dir=str(marks)),
                               name_prefix="flat", sharding_annotations=NamedSharding([[0, 1], [2, 3]], ["dp", "tp"]),
                               env_vars={"FACE_GROUP": "group", "FACE_SHARED": "group", "RANK": "99"})
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield group, marks
    group.shutdown(force=True)


class TestOneWorkerPerBundle:
    def test_workers_are_the_users_actors_in_their_bundles_with_the_rank_env(self, flat, cluster):
        g, _ = flat
        envs = ray.get([w.env.remote(RANK_VARS + LAYER_VARS) for w in g.workers])  # the user's own handles
        assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]  # rank_env beats the group's RANK=99
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
        assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
        assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {("4", "2")}
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {(g.master_address, str(g.master_port))}
        ports = ast.literal_eval(envs[0]["AVAILABLE_PORT_LIST"])
        assert len(ports) == 4 and all(1400 <= p < 1999 for p in ports)
        # lowest to highest: system < group env_vars < configure_worker
        assert {(e["FACE_SYSTEM"], e["FACE_GROUP"], e["FACE_SHARED"]) for e in envs} == {
            ("system", "group", "configure_worker")}
        slots = cluster.slots()
        assert ray.get([w.where.remote() for w in g.workers]) == [(s.node_id, s.placement_group.id.hex())
                                                                  for s in slots]
        args, kwargs = ray.get(g.workers[3].init_seen.remote())
        assert args == ("a",) and kwargs == {"k": 1, "leader_of": (1, [1])}
        assert g.dp_size == 4 and g.get_dp_leader_worker_idx(3) == 3 and len(g._initializer_pool) == 2
        with pytest.raises(IndexError):
            g.get_dp_leader_worker_idx(4)
        assert [(m["node_idx"], m["global_rank"], m["name"]) for m in g.worker_metadata] == [
            (0, 0, "flat-0-0"), (0, 1, "flat-0-1"), (1, 2, "flat-1-0"), (1, 3, "flat-1-1")]

    def test_single_and_multiple_data(self, flat):
        g, _ = flat
        assert ray.get(g.run_single_worker_single_data("take", 2, x=1)) == (2, {"x": 1})
        batch = {"ids": [7, 8]}
        out = ray.get(g.run_all_workers_single_data("take", x=batch))
        assert [r for r, _ in out] == [0, 1, 2, 3] and all(kw["x"] == batch for _, kw in out)
        assert [r for r, _ in ray.get(g.run_all_workers_single_data("take", x=0, run_rank_0_only_axes=["tp"]))] == [0, 2]
        out = ray.get(g.run_all_workers_multiple_data("take", x=["a", "b", "c", "d"], common_kwargs={"c": 0}))
        assert out == [(0, {"x": "a", "c": 0}), (1, {"x": "b", "c": 0}), (2, {"x": "c", "c": 0}), (3, {"x": "d", "c": 0})]
        out = ray.get(g.run_all_workers_multiple_data("take", x=["p", "q"], run_rank_0_only_axes=["tp"]))
        assert out == [(0, {"x": "p"}), (2, {"x": "q"})]
        for bad in (lambda: g.run_all_workers_multiple_data("take", x=["too", "few"]),
                    lambda: g.run_all_workers_multiple_data("take", ["a", "b", "c", "d"]),  # data by keyword only
                    lambda: g.run_all_workers_single_data("take", 1),
                    lambda: g.run_single_worker_single_data("take", 0, 1)):
            with pytest.raises(AssertionError):
                bad()

    def test_sharded_dispatch_on_two_axes(self, flat):
        g, _ = flat
        d0, d1 = {"dp": [0]}, {"dp": [1]}
        fut = g.run_all_workers_sharded_data("take", x=[d0, d1], in_sharded_axes=["dp"], replicate_on_axes=["tp"],
                                             output_is_replicated=["tp"])
        assert isinstance(fut, MultiWorkerFuture) and fut.called_workers == [0, 1, 2, 3]
        assert fut.return_from_workers == [0, 2]
        assert [kw["x"] for _, kw in ray.get(fut.futures)] == [d0, d0, d1, d1]  # replicated along tp
        assert g.get_all_worker_results(fut) == [(0, {"x": d0}), (2, {"x": d1})]
        fut = g.run_all_workers_sharded_data("take", x=["t0", "t1"], in_sharded_axes=["tp"])  # dp is free
        assert (fut.called_workers, fut.return_from_workers) == ([0, 1], [0, 1])
        assert g.get_all_worker_results(fut) == [(0, {"x": "t0"}), (1, {"x": "t1"})]
        fut = g.run_all_workers_sharded_data("take", x=["t0", "t1"], in_sharded_axes=["tp"],
                                             make_dummy_calls_to_free_axes=True, common_kwargs={"step": 5})
        assert (fut.called_workers, fut.return_from_workers) == ([0, 1, 2, 3], [0, 1])
        assert [kw for _, kw in ray.get(fut.futures)] == [{"x": "t0", "step": 5}, {"x": "t1", "step": 5},
                                                           {"x": None, "step": 5}, {"x": None, "step": 5}]
        fut = g.run_all_workers_sharded_data("take", x=[["a", "b"], ["c", "d"]], in_sharded_axes=["dp", "tp"])
        assert g.get_all_worker_results(fut) == [(0, {"x": "a"}), (1, {"x": "b"}), (2, {"x": "c"}), (3, {"x": "d"})]
        with pytest.raises(ValueError, match="not found"):
            g.run_all_workers_sharded_data("take", x=[1], in_sharded_axes=["pp"])
        with pytest.raises(ValueError, match="both sharded and replicated"):
            g.run_all_workers_sharded_data("take", x=[1, 2], in_sharded_axes=["dp"], replicate_on_axes=["dp"])

    def test_force_shutdown_skips_the_cleanup(self, flat):
        g, marks = flat
        workers = list(g.workers)
        assert g.shutdown(cleanup_method="bye", force=True) is True
        assert list(marks.iterdir()) == [] and g.workers == [] and g._initializer_pool == {}
        assert all(dead(w) for w in workers)
        assert g.shutdown() is True


# -- tied groups, a @ray.remote class, graceful shutdown ---------------------------------------------------
def test_tied_groups_precedence_and_graceful_shutdown(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("FACE_SYSTEM", "system")
    monkeypatch.setenv("FACE_LAYER", "system")
    g = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.TiedRecorder", marker_dir=str(tmp_path), slow_rank=3),
                       name_prefix="tied", bundle_indices_list=[(0, [0, 1]), (1, [0, 1])],
                       sharding_annotations=NamedSharding([[0, 1], [2, 3]], ["dp", "tp"]))
    assert g.dp_size == 2 and g.dp_leader_worker_indices == [0, 2] and g.get_dp_leader_worker_idx(1) == 2
    assert [m["name"] for m in g.worker_metadata] == ["tied-grp0-0", "tied-grp0-1", "tied-grp1-0", "tied-grp1-1"]
    assert [m["dp_shard_idx"] for m in g.worker_metadata] == [0, 0, 1, 1]
    seen = [kw for _, kw in ray.get([w.init_seen.remote() for w in g.workers])]
    assert [s["leader_of"] for s in seen] == [(0, [0, 1]), None, (1, [0, 1]), None]  # only leaders get them
    assert {s["gpus_per_node"] for s in seen} == {8}
    envs = ray.get([w.env.remote(RANK_VARS + LAYER_VARS) for w in g.workers])
    # lowest to highest: @ray.remote runtime_env < system < configure_worker (+ its runtime_env overrides)
    assert {(e["FACE_REMOTE_ONLY"], e["FACE_SYSTEM"], e["FACE_LAYER"], e["FACE_OVERRIDE"]) for e in envs} == {
        ("ray_remote", "system", "configure_worker", "runtime_env_override")}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert ray.get(ray.get_actor("tied-grp1-0").env.remote(["RANK"])) == {"RANK": "2"}  # NeMo RL names its actors
    g_workers = list(g.workers)
    # rank 3's cleanup outlasts the timeout: shutdown says so, and still stops every worker
    assert g.shutdown(cleanup_method="bye", timeout=4) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bye-0", "bye-1", "bye-2"]
    assert all(dead(w) for w in g_workers)
    with pytest.raises(ValueError):  # the names are released with the actors
        ray.get_actor("tied-grp1-0")


# -- a worker that is gone ----------------------------------------------------------------------------------
def test_get_results_names_the_worker_whose_actor_is_gone(cluster):
    """NeMo RL's get_results raises Ray's bare actor error; here it names the worker (index, actor name,
    node) and the cause, as a WorkerFailureError (the project's error base, still a RuntimeError)."""
    from runtime.errors import RaytrainError
    from runtime.workers.failures import WorkerFailureError
    g = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Recorder"), name_prefix="gone",
                       sharding_annotations=NamedSharding([[0, 1], [2, 3]], ["dp", "tp"]))
    try:
        assert len(g.get_all_worker_results(g.run_all_workers_sharded_data(
            "take", in_sharded_axes=["dp", "tp"], x=[[0, 1], [2, 3]]))) == 4
        ray.kill(g.workers[2], no_restart=True)
        assert dead(g.workers[2])
        future = g.run_all_workers_sharded_data("take", in_sharded_axes=["dp", "tp"], x=[[0, 1], [2, 3]])
        with pytest.raises(WorkerFailureError) as e:
            g.get_all_worker_results(future)
        assert e.value.rank == 2 and isinstance(e.value, RaytrainError) and isinstance(e.value, RuntimeError)
        assert isinstance(e.value, ray.exceptions.RayActorError)  # what NeMo RL's own callers catch
        assert "worker 2 (gone-1-0, node 1" in str(e.value) and "is gone: actor exit" in str(e.value), str(e.value)
    finally:
        g.shutdown(force=True)


def test_restart_on_failure_starts_a_dead_workers_actor_again_from_its_builder(cluster):
    """Opt-in (NeMo RL's default, no restarts, is kept): the dead rank's actor is started again from the
    same builder in the same bundle, with the same environment and name; the failed call raises
    WorkerGroupRestarted naming it and can be made again; past max_restarts the error says so."""
    from runtime.workers.failures import WorkerFailureError, WorkerGroupRestarted
    shard = dict(in_sharded_axes=["dp", "tp"], x=[[0, 1], [2, 3]])
    g = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Recorder", "a", k=1), name_prefix="again",
                       sharding_annotations=NamedSharding([[0, 1], [2, 3]], ["dp", "tp"]),
                       restart_on_failure=True, max_restarts=1)
    try:
        old = g.workers[1]
        bundle_before = ray.get(old.where.remote())
        ray.kill(old, no_restart=True)
        assert dead(old)
        with pytest.raises(WorkerGroupRestarted) as e:
            g.get_all_worker_results(g.run_all_workers_sharded_data("take", **shard))
        assert e.value.rank == 1 and "restarted worker(s) [1] (restart 1 of 1)" in str(e.value), str(e.value)
        assert g.workers[1] is not old and g.restarts == 1
        results = g.get_all_worker_results(g.run_all_workers_sharded_data("take", **shard))
        assert [rank for rank, _ in results] == [0, 1, 2, 3]  # the same RANK in the new actor's environment
        assert ray.get(g.workers[1].where.remote()) == bundle_before  # same node, same placement group
        assert ray.get(g.workers[1].init_seen.remote())[0] == ("a",)  # its __init__ ran again, same arguments
        assert ray.get(ray.get_actor("again-0-1").env.remote(["RANK"])) == {"RANK": "1"}  # the same name
        ray.kill(g.workers[3], no_restart=True)
        assert dead(g.workers[3])
        with pytest.raises(WorkerFailureError, match=r"used its 1 restart\(s\)"):
            g.get_all_worker_results(g.run_all_workers_sharded_data("take", **shard))
    finally:
        g.shutdown(force=True)
    plain = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Recorder"), name_prefix="plain")
    try:
        with pytest.raises(WorkerFailureError, match="without restart_on_failure"):
            plain.restart_failed_workers()
    finally:
        plain.shutdown(force=True)


def test_a_worker_killed_mid_call_is_named_then_recreated_in_a_spare_bundle(cluster, tmp_path):
    """Restarts on: rank 1 dies (os._exit) while its call is in flight; the call's error names the rank,
    its node and the cause; its actor is re-created in the spare bundle of its node (the group has one
    worker per node on 2-bundle nodes), with the same options and environment; the user's setup
    (__init__) runs again; the call made again succeeds."""
    from runtime.wait import wait_until
    from runtime.workers.failures import WorkerGroupRestarted
    g = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Lifecycle", marker_dir=str(tmp_path)),
                       name_prefix="phoenix", workers_per_node=1, sharding_annotations=NamedSharding([0, 1], ["dp"]),
                       restart_on_failure=True, max_restarts=2)
    call = dict(in_sharded_axes=["dp"], x=["a", "b"])
    try:
        pgs = cluster.get_placement_groups()
        assert g.get_all_worker_results(g.run_all_workers_sharded_data("step", **call)) == [(0, "a"), (1, "b")]
        assert wait_until(lambda: [bundles_held(pg) for pg in pgs] == [{0}, {0}], timeout_s=10, what="bundle 0 held")
        old, (node, pg_id) = g.workers[1], ray.get(g.workers[1].where.remote())
        env_before = ray.get(old.env.remote(RANK_VARS))
        with pytest.raises(WorkerGroupRestarted) as e:
            g.get_all_worker_results(g.run_all_workers_sharded_data("step", common_kwargs=dict(die_on_rank=1, after_s=0.5), **call))
        assert e.value.rank == 1 and e.value.node, str(e.value)
        assert "worker 1 (phoenix-1-0, node 1" in str(e.value) and "is gone: actor exit" in str(e.value), str(e.value)
        assert g.workers[1] is not old and g.restarts == 1
        assert g.get_all_worker_results(g.run_all_workers_sharded_data("step", **call)) == [(0, "a"), (1, "b")]
        assert ray.get(g.workers[1].where.remote()) == (node, pg_id)  # the same node and placement group ...
        assert wait_until(lambda: [bundles_held(pg) for pg in pgs] == [{0}, {1}], timeout_s=10,
                          what="rank 1 in its node's spare bundle")  # ... in the bundle no worker held
        assert ray.get(g.workers[1].env.remote(RANK_VARS)) == env_before  # the same environment
        assert ray.get(ray.get_actor("phoenix-1-0").env.remote(["RANK"])) == {"RANK": "1"}  # and name
        assert g.worker_metadata[1]["node_idx"] == 1 and g.worker_metadata[1]["bundle_indices"] == (1, [1])
        inits = {r: (tmp_path / f"init-{r}").read_text().split() for r in (0, 1)}
        assert len(inits[0]) == 1 and len(inits[1]) == 2 and inits[1][0] != inits[1][1]  # setup ran again, anew
        with pytest.raises(WorkerGroupRestarted):  # again: back into bundle 0, now the spare one
            g.get_all_worker_results(g.run_all_workers_sharded_data("step", common_kwargs=dict(die_on_rank=1), **call))
        assert g.get_all_worker_results(g.run_all_workers_sharded_data("step", **call)) == [(0, "a"), (1, "b")]
        assert wait_until(lambda: [bundles_held(pg) for pg in pgs] == [{0}, {0}], timeout_s=10, what="bundle 0 again")
    finally:
        g.shutdown(force=True)


def test_without_restarts_a_worker_killed_mid_call_is_named_and_stays_dead(cluster, tmp_path):
    """NeMo RL's default (no restart_on_failure): ray.kill lands while the call is in flight; the error
    names the rank, node and cause (Ray's error is its __cause__), nothing is restarted and the
    worker stays dead, as in NeMo RL."""
    from runtime.workers.failures import WorkerFailureError, WorkerGroupRestarted
    g = RayWorkerGroup(cluster, RayWorkerBuilder(f"{__name__}.Lifecycle", marker_dir=str(tmp_path)),
                       name_prefix="mortal", workers_per_node=1, sharding_annotations=NamedSharding([0, 1], ["dp"]))
    call = dict(in_sharded_axes=["dp"], x=["a", "b"])
    try:
        from runtime.wait import wait_until
        victim = g.workers[1]
        future = g.run_all_workers_sharded_data("step", common_kwargs=dict(after_s=20), **call)
        wait_until((tmp_path / "running-1").exists, timeout_s=60, what="rank 1's call to start")
        ray.kill(victim, no_restart=True)  # while its call is running
        with pytest.raises(WorkerFailureError) as e:
            g.get_all_worker_results(future)
        assert not isinstance(e.value, WorkerGroupRestarted) and e.value.rank == 1
        assert "worker 1 (mortal-1-0, node 1" in str(e.value) and "is gone: actor exit" in str(e.value), str(e.value)
        assert isinstance(e.value.__cause__, ray.exceptions.RayActorError)
        assert isinstance(e.value, ray.exceptions.RayActorError)  # NeMo RL's callers catch it as before
        # rank 0 is still in its call (it does not answer), on a live node: busy, not dead
        assert g.restarts == 0 and g.workers[1] is victim and g.dead_workers(timeout_s=2) == [1]
        assert (tmp_path / "init-1").read_text().count("\n") == 1  # its setup did not run again
        with pytest.raises(WorkerFailureError, match="worker 1 "):
            g.get_all_worker_results(g.run_all_workers_sharded_data("step", **call))
    finally:
        g.shutdown(force=True)

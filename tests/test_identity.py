"""Node identity from real scheduler variable sets (table-driven)."""
from pathlib import Path

import pytest

from runtime.cluster.identity import IdentityError, detect, expand_nodelist
from runtime.spec import parse_spec

SPEC = parse_spec({
    "cluster_type": "slurm", "cluster_name": "c", "fileroot": "/f", "cpu_image": "a", "gpu_image": "b",
    "node_type_from_node_name": {r"gpu-\d+": "g8", r"n\d+": "cpu"}, "gpu_type_from_node_name": {r"gpu-\d+": "a100"},
})


@pytest.mark.parametrize("expr,hosts", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu-[08-10,12],cpu1", ["gpu-08", "gpu-09", "gpu-10", "gpu-12", "cpu1"]),
    ("r[1-2]-c[1-2]", ["r1-c1", "r1-c2", "r2-c1", "r2-c2"]),
    ("a[001-002],b", ["a001", "a002", "b"]),
])
def test_expand_nodelist(expr, hosts):
    assert expand_nodelist(expr) == hosts


def test_bad_nodelist():
    with pytest.raises(IdentityError, match="unbalanced"):
        expand_nodelist("n[1-3")


# Variable sets as the schedulers set them (trimmed to what matters, plus noise).
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURM_JOB_NODELIST": "gpu-[01-03]",
         "SLURM_STEP_NODELIST": "gpu-[01-03]", "SLURM_NNODES": "3", "SLURM_GPUS_ON_NODE": "8",
         "SLURMD_NODENAME": "gpu-03", "SLURM_CPUS_ON_NODE": "64"}
SKY = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7", "SKYPILOT_NUM_NODES": "3",
       "SKYPILOT_NUM_GPUS_PER_NODE": "4", "HOSTNAME": "n7"}
DSTACK = {"DSTACK_NODE_RANK": "0", "DSTACK_NODES_IPS": "10.1.0.1\n10.1.0.2", "DSTACK_NODES_NUM": "2",
          "DSTACK_MASTER_NODE_IP": "10.1.0.1", "DSTACK_GPUS_PER_NODE": "2", "HOSTNAME": "x"}
K8S_JOB = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "3", "HOSTNAME": "train-3-abcde",
           "RAYTRAIN_HEAD_ADDRESS": "train-0.train-head.ml.svc.cluster.local", "RAYTRAIN_NUM_NODES": "4"}
K8S_STS = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "train-worker-2",
           "RAYTRAIN_HEAD_ADDRESS": "train-head", "RAYTRAIN_NUM_NODES": "3", "RAYTRAIN_GPUS_PER_NODE": "1"}


@pytest.mark.parametrize("env,expect", [
    (SLURM, dict(source="slurm", node_rank=2, num_nodes=3, head_address="gpu-01", hostname="gpu-03", gpus_per_node=8,
                 node_type="g8", gpu_type="a100")),
    (SKY, dict(source="skypilot", node_rank=1, num_nodes=3, head_address="10.0.0.5", gpus_per_node=4, node_type="cpu")),
    (DSTACK, dict(source="dstack", node_rank=0, num_nodes=2, head_address="10.1.0.1", gpus_per_node=2)),
    (K8S_JOB, dict(source="kubernetes", node_rank=3, num_nodes=4, head_address="train-0.train-head.ml.svc.cluster.local")),
    (K8S_STS, dict(source="kubernetes", node_rank=2, num_nodes=3, head_address="train-head", gpus_per_node=1)),
    ({"RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "1", "RAYTRAIN_HEAD_ADDRESS": "127.0.0.1"},
     dict(source="explicit", node_rank=0, num_nodes=1, head_address="127.0.0.1")),
])
def test_detect(env, expect):
    ident = detect(env, SPEC)
    for k, v in expect.items():
        assert getattr(ident, k) == v, k
    assert ident.is_head == (expect["node_rank"] == 0)


def test_skypilot_ip_list_gives_addresses():
    assert detect(SKY).node_addresses == ("10.0.0.5", "10.0.0.6", "10.0.0.7")


def test_contradiction_names_variables():
    with pytest.raises(IdentityError) as e:
        detect({**SLURM, **SKY})
    msg = str(e.value)
    assert "SLURM_NODEID='2'" in msg and "SKYPILOT_NODE_RANK='1'" in msg


def test_agreeing_sources_are_fine():
    env = {**SKY, "DSTACK_NODE_RANK": "1", "DSTACK_NODES_IPS": "10.0.0.5 10.0.0.6 10.0.0.7", "DSTACK_NODES_NUM": "3"}
    assert detect(env).node_rank == 1


def test_explicit_overrides_and_missing():
    assert detect(SKY, node_rank=0).node_rank == 0
    with pytest.raises(IdentityError, match="missing RAYTRAIN_NODE_RANK.*none"):
        detect({})
    with pytest.raises(IdentityError, match="outside 0..2"):
        detect({**SKY, "SKYPILOT_NODE_RANK": "5"})
    with pytest.raises(IdentityError, match="not a whole number"):
        detect({**SKY, "SKYPILOT_NODE_RANK": "one"})


def test_worker_step_offset_counts_after_the_head():
    """The sbatch workers' srun numbers its nodes from 0; the offset and explicit job values fix that."""
    step = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "n[2-3]", "SLURM_STEP_NUM_NODES": "2",
            "RAYTRAIN_NODE_RANK_OFFSET": "1", "RAYTRAIN_NUM_NODES": "3", "RAYTRAIN_HEAD_ADDRESS": "10.0.0.1"}
    ident = detect(step)
    assert (ident.node_rank, ident.num_nodes, ident.head_address, ident.source) == (2, 3, "10.0.0.1", "slurm")
    assert detect({**step, "RAYTRAIN_NODE_RANK": "0"}).node_rank == 0


def test_kubernetes_node_type_comes_from_the_node_name_not_the_pod_name():
    """A pod's HOSTNAME is the pod's name; the spec's patterns describe machines. The manifests pass
    spec.nodeName through the downward API as RAYTRAIN_NODE_NAME."""
    from runtime.spec import load_spec
    spec = load_spec(Path(__file__).resolve().parent.parent / "cluster_specs" / "kubernetes.json")
    pod = {**K8S_JOB, "HOSTNAME": "train-workers-2-x7k2p"}
    blind = detect(pod, spec)
    assert (blind.node_type, blind.gpu_type, blind.node_name) == (None, None, "train-workers-2-x7k2p")
    seen = detect({**pod, "RAYTRAIN_NODE_NAME": "gpu-node-17"}, spec)
    assert (seen.node_type, seen.gpu_type) == ("a100", "nvidia-a100-80gb")
    assert seen.hostname == "train-workers-2-x7k2p" and seen.node_name == "gpu-node-17"


EXPLICIT = {"RAYTRAIN_NODE_RANK": "0", "RAYTRAIN_NUM_NODES": "2", "RAYTRAIN_HEAD_ADDRESS": "head-0.svc", "HOSTNAME": "n1"}


@pytest.mark.parametrize("var,value", [
    ("RAYTRAIN_HEAD_ADDRESS", "head 0"), ("RAYTRAIN_HEAD_ADDRESS", "head\n[launch] forged"),
    ("RAYTRAIN_HEAD_ADDRESS", "$(id)"), ("RAYTRAIN_HEAD_ADDRESS", "-oProxyCommand=x"),
    ("RAYTRAIN_HEAD_ADDRESS", "http://head:6379"), ("RAYTRAIN_HEAD_ADDRESS", "h" * 254),
    ("HOSTNAME", "n1\n[launch node0/2 n1] barrier passed"), ("RAYTRAIN_NODE_NAME", "node 7"),
    ("RAYTRAIN_NUM_NODES", " 2"), ("RAYTRAIN_NUM_NODES", "2\n"), ("RAYTRAIN_NODE_RANK", "+0"),
])
def test_the_launchers_environment_is_parsed_like_flags(var, value):
    with pytest.raises(IdentityError, match=var if var.startswith("RAYTRAIN_N") else "not an IP address or a DNS name"):
        detect({**EXPLICIT, var: value})


def test_node_addresses_from_a_scheduler_are_checked_too():
    env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1\n--all", "SKYPILOT_NUM_NODES": "2", "HOSTNAME": "n1"}
    with pytest.raises(IdentityError, match="'--all' is not an IP address"):
        detect(env)


@pytest.mark.parametrize("good", ["10.0.0.1", "fd00::1", "head-0.job.ns.svc.cluster.local", "gpu_node-01", "n1."])
def test_ips_and_dns_names_pass(good):
    assert detect({**EXPLICIT, "RAYTRAIN_HEAD_ADDRESS": good}).head_address == good


def test_node_ip_flag_is_an_address():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "runtime", "launch", "--node-ip=$(id)", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--node-ip" in r.stderr and "not an IP address or a DNS name" in r.stderr, r.stderr

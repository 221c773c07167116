"""Who am I in this job? One normalized node identity from whatever the scheduler provides.

Sources, each read from the environment: Slurm, SkyPilot, dstack, Kubernetes (indexed Job or
StatefulSet ordinal plus a headless-service head address), and explicit RAYTRAIN_* variables.
Explicit values win; scheduler sources that are present must agree with each other, otherwise
the error names every variable that was seen.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Mapping, Optional

import hostlist

from runtime import addresses, contract as C
from runtime import numbers
from runtime.errors import InputError
from runtime.spec import ClusterSpec


class IdentityError(InputError):
    """The scheduler's variables do not give this node a place in the job; the message names them."""


@dataclass(frozen=True)
class NodeIdentity:
    source: str
    node_rank: int
    num_nodes: int
    head_address: str
    hostname: str
    gpus_per_node: int = 0
    node_addresses: tuple = field(default_factory=tuple)
    node_type: Optional[str] = None
    gpu_type: Optional[str] = None
    node_name: Optional[str] = None  # what node and GPU types are matched against (hostname unless told)

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm hostlist expression -> host names: 'n[1-3],gpu-[08-10,12]' -> n1 n2 n3 gpu-08 ...

    python-hostlist (the hostlist grammar Slurm uses, with its own size cap) does the work."""
    try:
        hosts = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as e:
        raise IdentityError(f"SLURM node list {nodelist[:200]!r} cannot be read: {e}") from None
    if not hosts:
        raise IdentityError(f"SLURM node list {nodelist[:200]!r} names no hosts")
    return hosts


def _int(env: Mapping[str, str], name: str, low: int = 0) -> Optional[int]:
    """A scheduler's number, or None when unset. '0' nodes is refused (low=1), never replaced by a count
    of hosts: a scheduler that says 0 is misconfigured, and guessing would wait for the wrong nodes."""
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return numbers.whole(v, name, low, numbers.COUNT_MAX)
    except InputError:
        raise IdentityError(f"{name}={v[:40]!r} is not a whole number ({low}-{numbers.COUNT_MAX}, ASCII digits "
                            "and nothing else)") from None


def _host(value: str, what: str) -> str:
    try:
        return addresses.host(value, what)
    except InputError as e:
        raise IdentityError(str(e)) from None


def _first(env: Mapping[str, str], names: tuple, low: int = 0) -> Optional[int]:
    """The first of NAMES that is set (each checked), or None."""
    for name in names:
        value = _int(env, name, low)
        if value is not None:
            return value
    return None


_GPU_COUNT = re.compile(r"(?:[A-Za-z0-9_.-]+:){0,2}([0-9]{1,4})(?:\([^()]{0,200}\))?")


def _gpus(value: Optional[str], name: str = "SLURM_GPUS_ON_NODE") -> int:
    """'8', 'gpu:8', 'a100:8', 'gpu:a100:4(IDX:0-3)' -> count (the first entry of a list). Linear time:
    one anchored match of a bounded pattern."""
    if not value:
        return 0
    first = value.split(",", 1)[0].strip()
    m = _GPU_COUNT.fullmatch(first)
    if not m:
        raise IdentityError(f"{name}={value[:100]!r} is not a GPU count such as 8, gpu:8 or gpu:a100:4")
    return int(m.group(1))


def _ips(value: Optional[str]) -> tuple:
    return tuple(x for x in re.split(r"[\s,]+", value or "") if x)


def _slurm(env):
    if "SLURM_JOB_ID" not in env or "SLURM_NODEID" not in env:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise IdentityError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not; run inside an allocation (srun/sbatch)")
    hosts = tuple(expand_nodelist(nodelist))
    n = _first(env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"), low=1) or len(hosts)
    gpus = _gpus(env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_GPUS_PER_NODE"))
    if n > len(hosts):
        raise IdentityError(f"Slurm says {n} node(s) but the node list {nodelist[:200]!r} has {len(hosts)}")
    return dict(node_rank=_int(env, "SLURM_NODEID"), num_nodes=n, head_address=hosts[0], node_addresses=hosts,
                gpus_per_node=gpus, hostname=env.get("SLURMD_NODENAME"))


def _prefixed(prefix, ips_var, gpus_var, num_var, head_var=None):
    def read(env):
        rank = _int(env, f"{prefix}_NODE_RANK")
        if rank is None:
            return None
        ips = _ips(env.get(ips_var))
        n = _int(env, num_var, low=1) or len(ips)
        if ips and n != len(ips):
            raise IdentityError(f"{num_var}={n} but {ips_var} lists {len(ips)} address(es) ({', '.join(ips[:8])}); "
                                "the barrier would wait for nodes that do not exist. Make them agree")
        head = env.get(head_var) if head_var and env.get(head_var) else (ips[0] if ips else None)
        if head is None:
            raise IdentityError(f"{prefix}_NODE_RANK is set but neither {ips_var} nor a head address is; cannot find the head")
        return dict(node_rank=rank, num_nodes=n, head_address=head, node_addresses=ips, gpus_per_node=_int(env, gpus_var) or 0)
    return read


def _kubernetes(env):
    if "KUBERNETES_SERVICE_HOST" not in env or not env.get(C.HEAD_ADDRESS):
        return None
    rank = _int(env, "JOB_COMPLETION_INDEX")
    if rank is None and not env.get(C.NODE_RANK):
        m = re.fullmatch(r".*-([0-9]{1,6})", env.get("HOSTNAME", "")[-64:])
        rank = int(m.group(1)) if m else None
    if rank is None:
        rank = _int(env, C.NODE_RANK)  # e.g. the head's own (non-indexed) Job
    if rank is None:
        raise IdentityError("on Kubernetes: no JOB_COMPLETION_INDEX, no RAYTRAIN_NODE_RANK and HOSTNAME has no "
                            "StatefulSet ordinal (name-N)")
    return dict(node_rank=rank, num_nodes=_int(env, C.NUM_NODES, low=1), head_address=env[C.HEAD_ADDRESS],
                gpus_per_node=_int(env, C.GPUS_PER_NODE) or 0)


SOURCES = {
    "slurm": (_slurm, ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NNODES", "SLURM_GPUS_ON_NODE")),
    "skypilot": (_prefixed("SKYPILOT", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_NUM_NODES"),
                 ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE")),
    "dstack": (_prefixed("DSTACK", "DSTACK_NODES_IPS", "DSTACK_GPUS_PER_NODE", "DSTACK_NODES_NUM", "DSTACK_MASTER_NODE_IP"),
               ("DSTACK_NODE_RANK", "DSTACK_NODES_IPS", "DSTACK_NODES_NUM", "DSTACK_MASTER_NODE_IP")),
    "kubernetes": (_kubernetes, ("KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX", "HOSTNAME", C.HEAD_ADDRESS,
                                 C.NODE_NAME)),
}
# RAYTRAIN_NODE_RANK_OFFSET is added to a scheduler's rank (the workers' srun step numbers its nodes from 0).
EXPLICIT = {"node_rank": C.NODE_RANK, "num_nodes": C.NUM_NODES,
            "head_address": C.HEAD_ADDRESS, "gpus_per_node": C.GPUS_PER_NODE}


def detect(env: Mapping[str, str] | None = None, spec: ClusterSpec | None = None, **explicit) -> NodeIdentity:
    """Resolve this node's identity; keyword arguments (node_rank=..., ...) override everything."""
    env = dict(os.environ if env is None else env)
    found = {}
    for name, (reader, _) in SOURCES.items():
        got = reader(env)
        if got is not None:
            found[name] = got
    if len(found) > 1:
        keys = ("node_rank", "num_nodes")
        values = {name: tuple(f.get(k) for k in keys) for name, f in found.items()}
        if len({v for v in values.values()}) > 1:
            seen = ", ".join(f"{v}={env[v]!r}" for name in found for v in SOURCES[name][1] if v in env)
            raise IdentityError(f"schedulers disagree on node rank / node count ({values}); variables seen: {seen}. "
                                f"Unset the stale ones or set RAYTRAIN_NODE_RANK and RAYTRAIN_NUM_NODES explicitly")
    source, base = next(iter(found.items()), ("explicit", {}))
    merged = dict(base)
    for key, var in EXPLICIT.items():
        if var in env and env[var] != "":
            merged[key] = env[var] if key == "head_address" else _int(env, var)
            if not found:
                source = "explicit"
    merged.update({k: v for k, v in explicit.items() if v is not None})
    missing = [EXPLICIT[k] for k in ("node_rank", "num_nodes", "head_address") if merged.get(k) is None]
    if missing:
        seen = sorted(k for k in env if k.startswith(("SLURM_", "SKYPILOT_", "DSTACK_", "RAYTRAIN_", "JOB_COMPLETION")))
        raise IdentityError(f"cannot tell this node's place in the job: missing {', '.join(missing)} "
                            f"(scheduler variables seen: {', '.join(seen) or 'none'}); set them or run under Slurm/SkyPilot/dstack/Kubernetes")
    rank, n = int(merged["node_rank"]), int(merged["num_nodes"])
    offset = _int(env, C.NODE_RANK_OFFSET)
    if offset and not env.get(C.NODE_RANK) and explicit.get("node_rank") is None:
        rank += offset  # a scheduler step that holds only some of the job's nodes (e.g. the workers' srun)
    if not 0 <= rank < n:
        raise IdentityError(f"node rank {rank} is outside 0..{n - 1} (source: {source})")
    hostname = _host(merged.get("hostname") or env.get("HOSTNAME") or socket.gethostname(), "this node's host name")
    # in a container the hostname is the container's (a pod's name); the machine's name, when the scheduler
    # passes it (Kubernetes' downward API spec.nodeName), is what the spec's node-name patterns describe
    node_name = _host(env[C.NODE_NAME], C.NODE_NAME) if env.get(C.NODE_NAME) else hostname
    head = _host(str(merged["head_address"]), f"the head address (source: {source})")
    addresses = tuple(_host(a, f"a node address (source: {source})") for a in merged.get("node_addresses") or ())
    return NodeIdentity(
        source=source, node_rank=rank, num_nodes=n, head_address=head, hostname=hostname,
        gpus_per_node=int(merged.get("gpus_per_node") or 0), node_addresses=addresses,
        node_type=spec.node_type(node_name) if spec else None, gpu_type=spec.gpu_type(node_name) if spec else None,
        node_name=node_name,
    )

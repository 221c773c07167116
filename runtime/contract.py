"""The contract between the deploy artifacts and the in-image runtime, in one place.

Every renderer (local, sbatch, Pyxis, Kubernetes, SkyPilot) starts each node with `launch_argv()`
and hands it the variables named here; the runtime reads exactly these names. Nothing else in
the project spells them out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

# Where the image keeps the code: runtime/ and the user's project under APP_ROOT (on PYTHONPATH),
# the project being the image's WORKDIR. A top-level directory of its own, away from /opt/venv, so
# an incremental .sqsh re-squashes only what the app layer touches (deploy/targets/pyxis/enroot_incremental.py).
APP_ROOT = "/app"
PROJECT_DIR = f"{APP_ROOT}/project"
IMAGE_PYTHONPATH = f"{APP_ROOT}:{PROJECT_DIR}"  # the image's PYTHONPATH (a scheduler that drops it sets it again)
# The venv the dependency layers install the wheels into (toolchain/image/venv_layer.py); a layer that
# touches it is a dependency layer, cached below an incremental .sqsh, never appended.
VENV = "/opt/venv"
# A layer tar this large is big (a wheel's, torch's is 1.7 GB): the store keeps only a few that are
# not part of the image being built, and an incremental .sqsh caches it below instead of appending it.
BIG_LAYER_BYTES = 1 << 30
# An image profile adds what one scheduler's own setup needs, on top of the image every target runs:
# `skypilot` lets the image's user become root (sudo) and carries the tools SkyPilot's pod setup
# installs otherwise (toolchain/image/images.py). The label says which profile an image has.
SKYPILOT_PROFILE = "skypilot"
PROFILES = ("default", SKYPILOT_PROFILE)
PROFILE_LABEL = "io.raytrain.profile"

# How every node starts: the image's interpreter runs the runtime package.
RUNTIME_CMD = ("python", "-m", "runtime")
# The one place the cluster half (runtime/cluster) names the worker half (runtime/workers): what a
# node's launcher calls, once every node joined, to start warm worker hosts on a node
# (f(node_id, how_many) -> their handles), resolved when it is first called; and the modules a
# zygote or a preloaded driver imports before it forks (training code imports them first).
WARM_HOSTS = "runtime.workers.host_pool:warm_up"
WORKER_MODULES = ("runtime.workers.virtual_cluster", "runtime.workers.worker_group")
DEFAULT_PORT_BASE = 20000
# Linux's default start of the ephemeral port range: Ray's pinned ports must stay below it on the
# nodes. A renderer checks against this (the nodes' value), never against the rendering host's.
PORTABLE_EPHEMERAL_LOW = 32768

# Set by the deploy artifacts, read by runtime.cluster.identity / runtime.cluster.launch
NODE_RANK = "RAYTRAIN_NODE_RANK"                # explicit rank of this node (0 = head)
NODE_RANK_OFFSET = "RAYTRAIN_NODE_RANK_OFFSET"  # added to a scheduler's rank (the workers' srun step)
NUM_NODES = "RAYTRAIN_NUM_NODES"
TRAIN_NODES = "RAYTRAIN_TRAIN_NODES"            # nodes the driver trains on; the rest of NUM_NODES are spares
HEAD_ADDRESS = "RAYTRAIN_HEAD_ADDRESS"
GPUS_PER_NODE = "RAYTRAIN_GPUS_PER_NODE"
NODE_IP = "RAYTRAIN_NODE_IP"                    # the address this node's Ray was started with (set by launch)
NODE_NAME = "RAYTRAIN_NODE_NAME"                # the scheduler's name for this machine (Kubernetes: spec.nodeName)
JOB_NAME = "RAYTRAIN_JOB_NAME"
ZYGOTE_ENV = "RAYTRAIN_ZYGOTE_SOCKET"  # this node's zygote (launch sets it for every process of the node's Ray)
# a job's sizes, bounded here only: the deploy flags, the settings, the job model (deploy/job.py), the held
# clusters' handles and the launcher's own flags (runtime/__main__.py) read these numbers
MAX_NODES = 10_000
MAX_CPUS_PER_NODE = 4096
MAX_GPUS_PER_NODE = 64
TORCHRUN_MAX_NPROC = 1024     # --nproc-per-node's bound, where the deploy side and the runtime take it
TORCHRUN_MAX_RESTARTS = 1000  # --max-restarts's
NODE_RESOURCE_PREFIX = "raytrain_node_"  # each node's Ray has the resource <prefix><node rank>: 1 (a job's node by rank)
KV_STATS = "RAYTRAIN_KV_STATS"  # "1": the launchers' Ray agents say the GCS key-value operations they made (bench/scale.py)
JOB_NAME_RE = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"  # a job's name: a DNS label, in file names and scheduler names
RUN_ID = "RAYTRAIN_RUN_ID"                      # one deploy = one run (checkpoints are per run); restarts keep it
SEED = "RAYTRAIN_SEED"
AUTH_TOKEN = "RAY_AUTH_TOKEN"                   # per job, generated at run time, never written to a file
SPEC_PATH = "CLUSTER_SPEC_PATH"                 # the baked cluster spec (image ENV)
# A node launcher's exit codes besides the driver's (runtime/cluster/launch.py), which the targets act on
# (Kubernetes' podFailurePolicy, the local target's diagnosis)
EXIT_NODE_CANNOT_START = 2  # the node could not start or join: configuration, not luck; retrying does not help
EXIT_HEAD_LOST = 3          # a worker lost the head before the driver's code was published: a consequence
EXIT_NODE_LOST = 4          # a worker's own Ray died after it joined (a crash, an OOM kill): luck, retryable
# Set by the runtime for the user's code
RESTARTS = "RAYTRAIN_RESTARTS"                  # how often the worker group was restarted


@dataclass(frozen=True)
class LaunchArgs:
    """What `python -m runtime launch` takes; the same on every target."""
    port_base: int = DEFAULT_PORT_BASE
    num_cpus: Optional[int] = None
    num_gpus: int = 0
    port_stride: int = 0


def launch_argv(args: LaunchArgs, driver: Optional[list[str]] = None, serve: bool = False) -> list[str]:
    """The node's command line; the driver command goes after `--` on the head only. A held cluster's
    nodes all get `--serve` and no driver (runtime/cluster/serving.py)."""
    argv = [*RUNTIME_CMD, "launch", f"--port-base={args.port_base}"]
    if args.num_cpus is not None:
        argv.append(f"--num-cpus={args.num_cpus}")
    if args.port_stride:
        argv.append(f"--port-stride={args.port_stride}")
    if args.num_gpus:
        argv.append(f"--num-gpus={args.num_gpus}")
    if serve:
        argv.append("--serve")
    elif driver:
        argv += ["--", *driver]
    return argv


def resolve(ref: str):
    """The object a 'package.module:name' reference names (WARM_HOSTS), imported on demand."""
    import importlib
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


# -- what a node says that the deploy side reads ------------------------------------------------------
# A held cluster's head logs SERVING_LINE once the barrier passed (runtime/cluster/serving.py); every
# target's `up` waits for it in the head's log (`is_serving`).
SERVING_LINE = "serving: the cluster is up"


def is_serving(log_text: str) -> bool:
    return SERVING_LINE in log_text


# A worker that leaves because the head published the driver's exit code says this line last
# (runtime/cluster/launch.py): its exit code is the driver's, a consequence, never the cause of a failure.
def driver_finished_line(code: int) -> str:
    return f"driver finished with {code}; leaving"


_DRIVER_FINISHED = re.compile(r"driver finished with -?[0-9]+; leaving\s*$")
# the launcher's own lines, tagged `[launch]` or `[launch nodeK/N host]` (runtime/cluster/node_log.py)
_LAUNCHER_LINE = re.compile(r"\[launch(?: [^\]]*)?\] ")


def left_after_driver(log_text: str) -> bool:
    """Whether the launcher's last line in a worker's log is its leaving on the driver's published exit
    code. The node's other processes may still print after it (its zygote's `ready` line, late on a
    busy machine)."""
    launcher = [l for l in log_text.splitlines() if _LAUNCHER_LINE.search(l)]
    return bool(launcher) and bool(_DRIVER_FINISHED.search(launcher[-1]))


# The sbatch script names its head node in one line (`head_line_echo`, rendered by
# deploy/targets/slurm/sbatch.py); `head_of` reads it back from the job's output (deploy/targets/slurm/held.py).
_HEAD_LINE = re.compile(r"raytrain: job (\S+) head (\S+) ")


def head_line_echo(nodes: int, spare_nodes: int = 0) -> str:
    """The sbatch script's shell line that prints the job's head (its variables expanded by bash there)."""
    spare = f" + {spare_nodes} spare" if spare_nodes else ""
    return (f'echo "raytrain: job $SLURM_JOB_ID head $head_node ($head_ip), {nodes} node(s){spare} '
            'restart ${SLURM_RESTART_COUNT:-0}"')


def head_of(output: str) -> Optional[str]:
    """The head node the sbatch script named in its output (the last job start's), None before it did."""
    found = _HEAD_LINE.findall(output)
    return found[-1][1] if found else None


# -- Ray's ports ---------------------------------------------------------------------------------------
WORKER_PORTS = 100


@lru_cache(maxsize=1)
def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass(frozen=True)
class RayPorts:
    """GCS at `base`; this node's own ports at base + node_offset (non-zero when several nodes share a host).

    `ephemeral_low`: where the nodes' ephemeral range starts; None = this host's (the runtime, on the
    node). Renderers pass the nodes' value (contract.PORTABLE_EPHEMERAL_LOW), never the rendering host's."""
    base: int = DEFAULT_PORT_BASE
    node_offset: int = 0
    ephemeral_low: Optional[int] = None

    def __post_init__(self):
        low = self.ephemeral_low or ephemeral_low()
        top = self.base + self.node_offset + 10 + WORKER_PORTS
        if self.base < 1024 or top > low:
            raise ValueError(f"port base {self.base}: Ray's ports {self.base}..{top} must lie "
                             f"between 1024 and the kernel's ephemeral range (starts at {low}); pick e.g. 20000, 21000, ...")

    @property
    def gcs(self) -> int:
        return self.base

    @property
    def node_base(self) -> int:
        """Where this node's own ports start."""
        return self.base + self.node_offset

    @property
    def node_manager(self) -> int:
        """The raylet's port: open once this node is up (readiness probes, the launcher's wait)."""
        return self.node_base + 1

    def node_args(self) -> list[str]:
        b = self.node_base
        return [f"--node-manager-port={self.node_manager}", f"--object-manager-port={b + 2}",
                f"--dashboard-agent-grpc-port={b + 3}", f"--dashboard-agent-listen-port={b + 4}",
                f"--metrics-export-port={b + 5}", f"--runtime-env-agent-port={b + 6}",
                f"--min-worker-port={b + 10}", f"--max-worker-port={b + 10 + WORKER_PORTS - 1}"]

    def head_args(self) -> list[str]:
        b = self.base
        # client server (b+7) and dashboard (b+8) stay reserved: minimal Ray runs neither
        return [f"--port={b}", *self.node_args()]

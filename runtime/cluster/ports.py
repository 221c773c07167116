"""Every port a Ray node opens, pinned from one base so two jobs on a node do not collide."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from runtime.contract import DEFAULT_PORT_BASE

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

"""How a node's launcher (and its Ray agent) says things: one tagged line on stderr, and the one error
that means the node could not start or join. Shared by runtime/cluster/launch.py and ray_agent.py, so
the agent does not import the launcher."""
from __future__ import annotations

import sys
from typing import Optional

from runtime.cluster.identity import NodeIdentity
from runtime.errors import RaytrainError


class LaunchError(RaytrainError):
    """The node could not start or join the job; the message says what to check."""


def log(ident: Optional[NodeIdentity], msg: str) -> None:
    tag = f"[launch node{ident.node_rank}/{ident.num_nodes} {ident.hostname}]" if ident else "[launch]"
    print(f"{tag} {msg}", file=sys.stderr, flush=True)

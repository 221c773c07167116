"""What a worker node tells the head about its start, through the head's GCS (Ray's KV store).

A worker whose Ray start failed and is being tried again says `retrying`; one that gives up says
`failed`, with the cause. The head's barrier reads them: a retry is shown once in the head's log and a
node that died in a failed attempt is waited for; a failure ends the barrier at once, naming the node
and its reason, instead of the barrier's deadline (minutes later, with a hint about the network).

Written by a short child (`python -m runtime.cluster.ray_agent report`): the launcher never loads Ray.
Best effort: a head that cannot be reached learns of the node when its deadline passes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass

from runtime import contract as C
from runtime import strict_json

PREFIX = b"raytrain:node:"
RETRYING, FAILED = "retrying", "failed"  # a record's state, named once for the worker and the head
STATES = (RETRYING, FAILED)
REPORT_TIMEOUT_S = 20


@dataclass(frozen=True)
class NodeRecord:
    rank: int
    host: str      # the scheduler's name for the node (what the logs call it)
    machine: str   # socket.gethostname(): what Ray lists as the node's hostname
    ip: str
    port: int      # the node manager port: with the ip or the machine, the node as Ray lists it
    state: str     # one of STATES
    attempt: int
    cause: str

    def key(self) -> bytes:
        """Its rank, attempt and state: a node's new state is a new key, so the head reads each key once
        (Reader), whatever the number of polls."""
        return PREFIX + f"{self.rank}:{self.attempt}:{self.state}".encode()

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, raw: bytes | str) -> "NodeRecord":
        """A record as a worker wrote it; ValueError for anything else."""
        fields = strict_json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        if not isinstance(fields, dict) or set(fields) != {f for f in cls.__dataclass_fields__}:
            raise ValueError(f"not a node record: {str(raw)[:200]!r}")
        ints = ("rank", "port", "attempt")
        typed = all(type(fields[f]) is (int if f in ints else str) for f in fields)
        if not typed or fields["state"] not in STATES:
            raise ValueError(f"not a node record: {str(raw)[:200]!r}")
        return cls(**fields)

    def is_node(self, node: dict) -> bool:
        """Whether Ray's NODE (an entry of ray.nodes()) is this record's: Ray may list another of the
        machine's addresses than the one the node was started with."""
        return node["NodeManagerPort"] == self.port and (node["NodeManagerAddress"] == self.ip
                                                         or node["NodeManagerHostname"] == self.machine)

    def describe(self) -> str:
        return f"node {self.rank} ({self.host}, {self.ip})"


def publish(address: str, record: NodeRecord, env: dict) -> bool:
    """Write RECORD in the GCS at ADDRESS (host:port); whether it was written."""
    argv = [sys.executable, "-m", "runtime.cluster.ray_agent", "--address", address, "report", record.encode()]
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=None if env.get(C.KV_STATS) == "1" else subprocess.DEVNULL,  # its KV count
                              timeout=REPORT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class Reader:
    """The records in the GCS, through Ray's internal KV functions (list by prefix, get by key): each
    key is read once (a key names a record's rank, attempt and state), so a poll costs one listing and
    a get per record written since the last one, not a get per record ever written."""

    def __init__(self, kv_list, kv_get):
        self.kv_list, self.kv_get = kv_list, kv_get
        self.seen: set = set()
        self.gets = 0

    def new(self) -> list[NodeRecord]:
        """The records written since the last call (what is not a record is skipped, once)."""
        out = []
        for key in self.kv_list(PREFIX) or []:
            if key in self.seen:
                continue
            raw = self.kv_get(key)
            self.gets += 1
            if raw is None:  # listed, then gone: looked at again next time
                continue
            self.seen.add(key)
            try:
                out.append(NodeRecord.decode(raw))
            except ValueError:
                continue  # not ours to judge: the barrier goes on with what it can read
        return out

"""The local target: the job's nodes as containers on the local Docker engine.

Head + workers on a user-defined network (the head reachable by a DNS alias), /dev/shm sized,
a per-job Ray token passed at run time, logs streamed with node prefixes, the head's exit code
returned, and every container and the network removed afterwards. `plan()` is the dry run.
"""
from __future__ import annotations

import secrets
import sys
import threading
from dataclasses import dataclass

import docker

from deploy.job import JobSpec


@dataclass(frozen=True)
class NodePlan:
    name: str
    alias: str
    image: str
    command: list
    environment: dict
    shm_size: str


def plan(job: JobSpec, run_id: str) -> list[NodePlan]:
    head = f"{job.name}-head"
    out = []
    for rank in range(job.nodes):
        alias = head if rank == 0 else f"{job.name}-w{rank}"
        cmd = ["python", "-m", "runtime", "launch", f"--port-base={job.port_base}", f"--num-cpus={job.cpus_per_node}"]
        if rank == 0:
            cmd += ["--", *job.command]
        env = {**job.env, "RAYTRAIN_NODE_RANK": str(rank), "RAYTRAIN_NUM_NODES": str(job.nodes),
               "RAYTRAIN_HEAD_ADDRESS": head, "RAYTRAIN_JOB_NAME": job.name}
        out.append(NodePlan(f"{alias}-{run_id}", alias, job.image, cmd, env, job.shm_size))
    return out


def _stream(container, prefix: str, out) -> None:
    buf = b""
    for chunk in container.logs(stream=True, follow=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            out.write(f"[{prefix}] {line.decode(errors='replace')}\n")
            out.flush()
    if buf:
        out.write(f"[{prefix}] {buf.decode(errors='replace')}\n")


def run(client: docker.DockerClient, job: JobSpec, out=None, timeout_s: float = 3600) -> int:
    out = out or sys.stdout
    run_id = secrets.token_hex(4)
    token = secrets.token_hex(32)  # per job, only in the containers' environment
    nodes = plan(job, run_id)
    network = client.networks.create(f"{job.name}-{run_id}", driver="bridge")
    containers, threads = [], []
    try:
        for node in reversed(nodes):  # workers first: they wait for the head
            api = client.api
            created = api.create_container(
                node.image, node.command, name=node.name, environment={**node.environment, "RAY_AUTH_TOKEN": token},
                labels={"io.raytrain.job": job.name},
                host_config=api.create_host_config(shm_size=node.shm_size, network_mode=network.name),
                networking_config=api.create_networking_config(
                    {network.name: api.create_endpoint_config(aliases=[node.alias])}))
            c = client.containers.get(created["Id"])
            containers.append(c)
            c.start()
            t = threading.Thread(target=_stream, args=(c, node.alias, out), daemon=True)
            t.start()
            threads.append(t)
        head = containers[-1]
        code = head.wait(timeout=timeout_s)["StatusCode"]
        for c in containers[:-1]:
            try:
                c.wait(timeout=60)
            except Exception:
                pass
        for t in threads:
            t.join(timeout=5)
        return code
    finally:
        for c in containers:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
        network.remove()

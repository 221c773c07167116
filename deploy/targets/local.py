"""The local target: the job's nodes as containers on the local Docker engine.

Head + workers on a user-defined network (the head reachable by a DNS alias), /dev/shm sized,
the spec's mounts bound in, a per-job Ray token passed at run time, logs streamed with node
prefixes, the head's exit code returned, and every container and the network removed afterwards.
`plan()` is the dry run.
"""
from __future__ import annotations

import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import docker

from deploy.job import JobSpec
from deploy.targets.base import ApplyContext, Artifacts, Target, TargetOptions
from runtime import contract as C
from runtime.spec import ClusterSpec


@dataclass(frozen=True)
class NodePlan:
    name: str
    alias: str
    image: str
    command: list
    environment: dict
    shm_size: str
    binds: dict


def plan(job: JobSpec, run_id: str) -> list[NodePlan]:
    head = f"{job.name}-head"
    out = []
    for rank in range(job.nodes):
        alias = head if rank == 0 else f"{job.name}-w{rank}"
        cmd = job.launch_argv(driver=rank == 0)
        env = {**job.env, C.NODE_RANK: str(rank), C.NUM_NODES: str(job.nodes), C.HEAD_ADDRESS: head,
               C.JOB_NAME: job.name}
        binds = {m.source: {"bind": m.target, "mode": "ro" if "ro" in (m.options or "").split(",") else "rw"}
                 for m in job.mounts}
        out.append(NodePlan(f"{alias}-{run_id}", alias, job.image.docker(), cmd, env, job.shm_size, binds))
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
                node.image, node.command, name=node.name, environment={**node.environment, C.AUTH_TOKEN: token},
                labels={"io.raytrain.job": job.name},
                host_config=api.create_host_config(shm_size=node.shm_size, network_mode=network.name,
                                                   binds=node.binds),
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


class Local(Target):
    name = "local"
    summary = "run the job here: head + workers as containers of the pushed digest on this Docker engine"
    Options = TargetOptions

    def preflight(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> list[str]:
        problems = []
        uid, _ = job.uid_gid
        for m in job.mounts:
            src = Path(m.source)
            if m.target == job.fileroot and not src.exists():
                continue  # apply creates it, writable by any uid (like /tmp)
            if not src.is_dir():
                problems.append(f"default_mount: {src} does not exist on this machine; create it or change the "
                                "spec's default_mount")
            elif m.target == job.fileroot and uid is not None:
                st = src.stat()
                if not (st.st_mode & 0o002 or st.st_uid == uid):
                    problems.append(f"fileroot: {src} is not writable by the image's uid {uid} (owner {st.st_uid}, "
                                    f"mode {st.st_mode & 0o7777:o}); `chmod 1777 {src}` or `chown {uid} {src}`")
        return problems

    def render(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> Artifacts:
        nodes = plan(job, "<run-id>")
        shown = [{**n.__dict__, "environment": {**n.environment, C.AUTH_TOKEN: "<generated per run>"}} for n in nodes]
        return Artifacts({}, shown)

    def apply(self, artifacts: Artifacts, job: JobSpec, spec, opts, ctx: ApplyContext) -> dict:
        client = ctx.engine()
        try:
            client.images.get(job.image.docker())
        except docker.errors.ImageNotFound:
            ctx.progress(f"pulling {job.image}")
            client.images.pull(job.image.docker())
        for m in job.mounts:
            if m.target == job.fileroot and not Path(m.source).exists():
                Path(m.source).mkdir(parents=True)
                Path(m.source).chmod(0o1777)
                ctx.progress(f"created the fileroot {m.source} (mode 1777)")
        ctx.progress(f"local: {job.nodes} node(s) of {job.image}")
        return {"exit_code": run(client, job)}


TARGET = Local()

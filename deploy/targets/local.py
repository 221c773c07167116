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
from typing import Optional
from pathlib import Path

import docker

from deploy import engine_pull, held_step
from deploy.handles import ClusterStatus, LocalHandle
from deploy.job import JobSpec
from deploy.targets.base import Applied, ApplyContext, Artifacts, HeldContext, Target, TargetOptions
from runtime import contract as C
from runtime.contract import EXIT_HEAD_LOST
from runtime.cluster import log_relay
from runtime.spec import ClusterSpec


@dataclass(frozen=True)
class NodePlan:
    name: str
    alias: str
    image: str
    command: list
    environment: dict
    shm_size: str
    binds: tuple  # "source:target:mode", one per mount, in the spec's order


# the mount options a Docker bind honours; any other (noexec, nosuid, ...) would be dropped silently
BIND_OPTIONS = frozenset({"ro", "rw"})


def bind_mode(options: str | None) -> str:
    return "ro" if "ro" in (options or "").split(",") else "rw"


def plan(job: JobSpec, run_id: str) -> list[NodePlan]:
    head = f"{job.name}-head"
    out = []
    for rank in range(job.nodes):
        alias = head if rank == 0 else f"{job.name}-w{rank}"
        cmd = job.launch_argv(driver=rank == 0)
        env = {**job.env, C.NODE_RANK: str(rank), C.NUM_NODES: str(job.nodes), C.HEAD_ADDRESS: head,
               C.JOB_NAME: job.name}
        binds = tuple(f"{m.source}:{m.target}:{bind_mode(m.options)}" for m in job.mounts)
        out.append(NodePlan(f"{alias}-{run_id}", alias, job.image.docker(), cmd, env, job.shm_size, binds))
    return out


def _stream(container, prefix: str, out) -> None:
    log_relay.prefixed(container.logs(stream=True, follow=True), prefix, out)


LABEL_JOB = "io.raytrain.job"
LABEL_HELD = "io.raytrain.held"  # a held cluster's containers (invoke up): removed by invoke down


def start_nodes(client: docker.DockerClient, job: JobSpec, run_id: str, token: str, labels: dict | None = None):
    """The job's network and containers, started workers first (they wait for the head); the head last."""
    nodes = plan(job, run_id)
    network = client.networks.create(f"{job.name}-{run_id}", driver="bridge",
                                     labels={LABEL_JOB: job.name, **(labels or {})})
    containers = []
    try:
        for node in reversed(nodes):  # workers first: they wait for the head
            api = client.api
            created = api.create_container(
                node.image, node.command, name=node.name, environment={**node.environment, C.AUTH_TOKEN: token},
                labels={LABEL_JOB: job.name, **(labels or {})},
                host_config=api.create_host_config(shm_size=node.shm_size, network_mode=network.name,
                                                   binds=list(node.binds)),
                networking_config=api.create_networking_config(
                    {network.name: api.create_endpoint_config(aliases=[node.alias])}))
            c = client.containers.get(created["Id"])
            containers.append(c)
            c.start()
    except BaseException:
        remove(client, [c.name for c in containers], network.name)
        raise
    return network, containers, nodes


def remove(client: docker.DockerClient, names: list[str], network: str) -> None:
    for name in names:
        try:
            client.containers.get(name).remove(force=True, v=True)  # and a VOLUME's anonymous volumes
        except docker.errors.NotFound:
            pass
    if not network:
        return
    try:
        client.networks.get(network).remove()
    except docker.errors.NotFound:
        pass


WORKER_GRACE_S = 20  # a worker failed: the head hears of it and fails by itself well within this
SLOW_START = ("timed out during startup", "did not say it started", "ray start (worker) failed",
              "ray start --head failed")


@dataclass(frozen=True)
class Outcome:
    """How a local job ended: the head's exit code and, when it failed, which node failed first and why."""
    exit_code: int
    diagnosis: str = ""


def _exit_code(c) -> int | None:
    c.reload()
    return c.attrs["State"].get("ExitCode") if c.status in ("exited", "dead") else None


def _tail(c, lines: int = 12) -> list[str]:
    """A container's last lines."""
    return c.logs(tail=lines).decode(errors="replace").rstrip().splitlines()


def _left_after_driver(c) -> bool:
    """Whether a worker left with the driver's published exit code (read from more lines than are shown:
    its other processes may print after the launcher's last)."""
    return C.left_after_driver("\n".join(_tail(c, 60)))


def _watch(head, workers: list, timeout_s: float) -> tuple[int, bool]:
    """The head's exit code, and whether it was stopped here: a worker that fails first gives the head
    WORKER_GRACE_S to fail by itself (it hears of the node through Ray), then the head is stopped, so
    no job waits out a barrier. A worker that left with the driver's published exit code did not fail:
    the driver has ended, and the head, ending too, is not stopped however long its Ray takes to stop."""
    import time
    deadline = time.monotonic() + timeout_s
    worker_failed, stopped = None, False
    left: set = set()  # workers seen leaving after the driver
    while True:
        code = _exit_code(head)
        if code is not None:
            return code, stopped
        now = time.monotonic()
        for i, w in enumerate(workers):
            if worker_failed is None and i not in left and _exit_code(w) not in (None, 0):
                if _left_after_driver(w):
                    left.add(i)
                else:
                    worker_failed = now
        if (worker_failed is not None and now - worker_failed > WORKER_GRACE_S) or now > deadline:
            head.stop(timeout=10)
            stopped = True
        time.sleep(0.5)


def diagnose(head, head_alias: str, workers: list, aliases: list[str], cores: int, nodes: int,
             head_stopped: bool = False) -> str:
    """Which process failed first, its last lines, and the fix: a worker that failed by itself (not
    one that only lost the head, unless the head was stopped here because a worker failed, nor one
    that left with the driver's published exit code), else the head, whose driver it is."""
    def finished(c) -> str:
        return c.attrs["State"].get("FinishedAt", "")

    consequence = () if head_stopped else (EXIT_HEAD_LOST,)
    failed = sorted(((finished(w), alias, w) for w, alias in zip(workers, aliases)
                     if _exit_code(w) not in (None, 0, *consequence) and not _left_after_driver(w)),
                    key=lambda t: t[0])
    _, alias, culprit = failed[0] if failed else ("", head_alias, head)
    lines = _tail(culprit)
    text = "\n".join(lines)
    if any(mark in text for mark in SLOW_START):
        fix = (f"this machine could not start every node's Ray in time ({nodes} nodes on {cores} core(s), "
               "beside whatever else runs here): deploy again when it is less busy, or with fewer nodes (--nodes)")
    else:
        fix = "its lines say why; fix that and deploy again"
    stopped = f" (the head was stopped {WORKER_GRACE_S} s later)" if head_stopped and culprit is not head else ""
    who = f"node {alias}" if culprit is not head or head_stopped else f"the driver on the head ({alias})"
    return (f"{who} failed first (exit {_exit_code(culprit)}){stopped}; its last lines:\n    "
            + "\n    ".join(lines) + f"\n  fix: {fix}")


def runs_on_host(job: JobSpec) -> Optional[Path]:
    """Where the run's TensorBoard event files are on this machine: <fileroot>/runs/<job>/<run id> (as the
    example writes them) through the fileroot's bind mount; None without one."""
    run_id = job.env.get(C.RUN_ID)
    for m in job.mounts:
        if m.target == job.fileroot and run_id:
            return Path(m.source) / "runs" / job.name / run_id
    return None


def run(client: docker.DockerClient, job: JobSpec, out=None, timeout_s: float = 3600) -> Outcome:
    import os
    out = out or sys.stdout
    run_id = secrets.token_hex(4)
    token = secrets.token_hex(32)  # per job, only in the containers' environment
    network, containers, nodes = start_nodes(client, job, run_id, token)
    threads = []
    try:
        for c, node in zip(containers, reversed(nodes)):
            t = threading.Thread(target=_stream, args=(c, node.alias, out), daemon=True)
            t.start()
            threads.append(t)
        head, workers = containers[-1], containers[:-1]
        code, stopped = _watch(head, workers, timeout_s)
        for c in workers:
            try:
                c.wait(timeout=60)
            except Exception:
                pass
        for t in threads:
            t.join(timeout=5)
        if code == 0:
            return Outcome(0)
        aliases = [n.alias for n in reversed(nodes)][:-1]
        return Outcome(code, diagnose(head, nodes[0].alias, workers, aliases, os.cpu_count() or 1, job.nodes,
                                      head_stopped=stopped))
    finally:
        remove(client, [c.name for c in containers], network.name)


def hold(client: docker.DockerClient, job: JobSpec, progress, timeout_s: float = 300) -> LocalHandle:
    """Start the nodes detached with the head serving; return once it serves (the handle), or remove
    everything and raise with the head's last lines."""
    from deploy.job import DeployError
    from runtime.wait import wait_until
    run_id = secrets.token_hex(4)
    network, containers, nodes = start_nodes(client, job, run_id, secrets.token_hex(32), labels={LABEL_HELD: job.name})
    head = containers[-1]
    progress(f"local: {job.nodes} node(s) of {job.image} starting; waiting for the head to serve")

    def serving() -> bool:
        head.reload()
        if head.status == "exited":
            raise DeployError(f"the head exited ({head.attrs['State'].get('ExitCode')}) before it served:\n    "
                              + "\n    ".join(head.logs(tail=15).decode(errors="replace").splitlines()))
        return C.is_serving(head.logs(tail=50).decode(errors="replace"))
    try:
        wait_until(serving, timeout_s=timeout_s, interval_s=0.2, what=f"the head {head.name} to serve",
                   hint="the nodes did not form a cluster", logs=lambda: head.logs(tail=15).decode(errors="replace"))
    except BaseException:
        remove(client, [c.name for c in containers], network.name)
        raise
    return LocalHandle(network=network.name, head=head.name, containers=[c.name for c in containers],
                       aliases=[n.alias for n in reversed(nodes)])


def held_status(client: docker.DockerClient, handle: LocalHandle) -> ClusterStatus:
    states = {}
    for name in handle.containers:
        try:
            states[name] = client.containers.get(name).status
        except docker.errors.NotFound:
            states[name] = "gone"
    up = bool(states) and all(v == "running" for v in states.values())
    return ClusterStatus(up, states)




def held_run(client: docker.DockerClient, handle: LocalHandle, code_tar: bytes, rel_dir: str, argv: list[str],
             env: dict, out=None) -> int:
    """Unpack the code (a tar under REL_DIR) in the head container and run the driver there; its exit code."""
    out = out or sys.stdout
    head = client.containers.get(handle.head)
    head.put_archive(held_step.UNPACK_ROOT, code_tar)  # relative paths: /tmp's own mode is not in the tar
    api = client.api
    ex = api.exec_create(head.id, held_step.runtime_run(rel_dir, argv, from_stdin=False),
                         environment=env, stdout=True, stderr=True)
    log_relay.prefixed(api.exec_start(ex["Id"], stream=True), "run", out)
    return api.exec_inspect(ex["Id"])["ExitCode"]


def _held_objects(client: docker.DockerClient, handle: LocalHandle) -> tuple[list[str], str]:
    """The handle's containers and network that carry the held-cluster label its head carries: a record
    naming anything else (another job's containers, the `host` network) removes nothing of it."""
    try:
        held = client.containers.get(handle.head).labels.get(LABEL_HELD)
    except docker.errors.NotFound:
        held = None
    if not held:  # the head is gone: what is left of the cluster still carries one label value
        found = {c.labels.get(LABEL_HELD) for c in client.containers.list(
            all=True, filters={"label": LABEL_HELD}) if c.name in handle.containers}
        held = found.pop() if len(found) == 1 else None
    if not held:
        return [], ""
    ours = [c.name for c in client.containers.list(all=True, filters={"label": f"{LABEL_HELD}={held}"})
            if c.name in handle.containers]
    networks = client.networks.list(names=[handle.network], filters={"label": f"{LABEL_HELD}={held}"})
    return ours, handle.network if any(n.name == handle.network for n in networks) else ""


def held_down(client: docker.DockerClient, handle: LocalHandle, grace_s: float = 20) -> list[str]:
    """SIGTERM to the head (it stops serving and publishes 0, the workers leave), then remove the
    cluster's containers and network: only those that carry its held-cluster label."""
    names, network = _held_objects(client, handle)
    if handle.head in names:
        client.containers.get(handle.head).stop(timeout=int(grace_s))
        for name in names:
            try:
                client.containers.get(name).wait(timeout=grace_s)
            except Exception:  # noqa: BLE001 - removed below in any case
                pass
    remove(client, names, network)
    return names


class Local(Target):
    name = "local"
    summary = "run the job here: head + workers as containers of the pushed digest on this Docker engine"
    Options = TargetOptions

    def preflight(self, job: JobSpec, spec: ClusterSpec, opts: TargetOptions) -> list[str]:
        problems = []
        uid, _ = job.uid_gid
        for m in job.mounts:
            unsupported = sorted(set((m.options or "").split(",")) - BIND_OPTIONS - {""})
            if unsupported:
                problems.append(f"mount {m.as_string()}: option(s) {', '.join(unsupported)} cannot be honoured by a "
                                "Docker bind on the local target (it takes ro or rw); drop them for local runs")
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

    def apply(self, artifacts: Artifacts, job: JobSpec, spec, opts, ctx: ApplyContext) -> Applied:
        client = ctx.engine()
        self._materialise(client, job, ctx)
        if job.serve:
            return Applied(held=hold(client, job, ctx.progress))
        ctx.progress(f"local: {job.nodes} node(s) of {job.image}")
        outcome = run(client, job)
        runs = runs_on_host(job)
        if runs is not None and runs.is_dir() and not str(runs).startswith(job.fileroot.rstrip("/") + "/"):
            # the driver named its own path; here it is elsewhere (the fileroot's bind mount)
            ctx.progress(f"curves on this machine: {runs} (see them: tensorboard --logdir {runs})")
        return Applied(exit_code=outcome.exit_code, diagnosis=outcome.diagnosis or None)

    def _materialise(self, client, job: JobSpec, ctx: ApplyContext) -> None:
        """The image here and the fileroot's directory made, before any container starts."""
        engine_pull.image(client, job.image.docker(), ctx.progress, ctx.from_build)
        for m in job.mounts:
            if m.target == job.fileroot and not Path(m.source).exists():
                Path(m.source).mkdir(parents=True)
                Path(m.source).chmod(0o1777)
                ctx.progress(f"created the fileroot {m.source} (mode 1777)")

    # -- a held cluster (invoke up / run / status / down) ----------------------------------------
    handle = LocalHandle

    def held_status(self, handle: LocalHandle, ctx: HeldContext) -> ClusterStatus:
        return held_status(ctx.engine(), handle)

    def held_run(self, handle: LocalHandle, ctx: HeldContext, code_tar: bytes, rel_dir: str, argv: list[str],
                 run_env: dict) -> int:
        return held_run(ctx.engine(), handle, code_tar, rel_dir, argv, run_env, ctx.out)

    def held_down(self, handle: LocalHandle, ctx: HeldContext) -> list[str]:
        return held_down(ctx.engine(), handle)


TARGET = Local()

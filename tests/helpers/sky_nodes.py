"""A SkyPilot task's nodes as containers of its image, started the way SkyPilot runs a task on a
docker-image cluster: the task's envs and secrets in the environment, SkyPilot's own SKYPILOT_*
variables (ranks in the cluster's order, the head first), then `run:` through bash, in SkyPilot's
working directory and without the image's PYTHONPATH (SkyPilot starts its Ray, which starts every
task, with `env -u PYTHONPATH`: seen on a real SkyPilot 0.14.1 on Kubernetes)."""
from __future__ import annotations

import secrets

from helpers.k8s_docker import cleanup


WORKDIR = "/tmp/sky_workdir"  # SkyPilot's ~/sky_workdir, where a task's workdir is synced and its run starts


def sky_env(names: list[str], rank: int, task_envs: dict) -> dict:
    """A task's environment on node RANK: the image's PYTHONPATH gone (empty) unless the task sets it."""
    return {"PYTHONPATH": "", **task_envs, "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "\n".join(names),
            "SKYPILOT_NUM_NODES": str(len(names)), "SKYPILOT_NUM_GPUS_PER_NODE": "0"}


def start(client, task: dict, prefix: str) -> tuple[list, list[str], object]:
    """(the containers by rank, their names, their network): the workers first, as a scheduler may."""
    names = [f"{prefix}-n{r}" for r in range(task["num_nodes"])]
    network = client.networks.create(prefix)
    containers: dict = {}
    token = secrets.token_hex(32)  # the task's secret, as `sky launch --secret` gives it to every node
    try:
        for rank in reversed(range(len(names))):
            env = {**sky_env(names, rank, task["envs"]), "RAY_AUTH_TOKEN": token}
            containers[rank] = client.containers.run(
                task["resources"]["image_id"].removeprefix("docker:"),
                ["bash", "-c", f"mkdir -p {WORKDIR} && cd {WORKDIR} && exec bash -c \"$0\"", task["run"]],
                entrypoint=[], environment=env, name=names[rank], hostname=names[rank], network=network.name,
                shm_size="1g", detach=True)
    except Exception:
        cleanup(containers, network)
        raise
    return [containers[r] for r in range(len(names))], names, network


def remove(containers: list, network) -> None:
    cleanup(dict(enumerate(containers)), network)

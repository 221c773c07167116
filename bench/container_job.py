"""Three containers from an image, started only with the variables a SkyPilot-style scheduler gives
(no runtime flag tells a node its place): the job tests/test_runtime_containers.py checks and
bench/cluster_formation.py times. Containers through testcontainers (TESTCONTAINERS_RYUK_DISABLED=true:
its reaper image cannot be pulled here)."""
from __future__ import annotations

import secrets

import docker
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

NAMES = ["rt-head", "rt-w1", "rt-w2"]


class Job:
    """Three containers from the image, as a SkyPilot-style scheduler would start them."""

    def __init__(self, image, train_args=(), launch_args=(), token=None):
        self.network = Network()
        self.network.create()
        self.token = token or secrets.token_hex(32)
        self.image, self.train_args, self.launch_args = image, list(train_args), list(launch_args)
        self.containers = {}

    def start(self, rank):
        env = {"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "\n".join(NAMES), "SKYPILOT_NUM_NODES": "3",
               "RAY_AUTH_TOKEN": self.token}
        cmd = ["python", "-m", "runtime", "launch", "--num-cpus", "2", *self.launch_args]
        if rank == 0:
            cmd += ["--", "python", "train.py", "--cpus-per-worker", "0.5", "--fileroot", "/tmp/job", *self.train_args]
        c = (DockerContainer(self.image).with_network(self.network).with_network_aliases(NAMES[rank])
             .with_name(f"{NAMES[rank]}-{self.token[:8]}").with_envs(**env).with_command(cmd)
             .with_kwargs(shm_size="1g"))
        c.start()
        self.containers[rank] = c
        return c

    def wait(self, rank, timeout=240) -> int:
        return self.containers[rank].get_wrapped_container().wait(timeout=timeout)["StatusCode"]

    def logs(self, rank) -> str:
        return self.containers[rank].get_wrapped_container().logs().decode(errors="replace")

    def close(self):
        for c in self.containers.values():
            try:
                c.get_wrapped_container().remove(force=True)
            except docker.errors.NotFound:
                pass
        self.network.remove()

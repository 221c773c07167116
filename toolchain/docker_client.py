"""One place that opens the Docker engine connection, with an actionable error."""
from __future__ import annotations

import docker
from docker.errors import DockerException

from toolchain.errors import ToolchainError


def engine() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except DockerException as e:
        raise ToolchainError(
            f"cannot reach the Docker engine ({e}); start dockerd or set DOCKER_HOST to its socket"
        ) from None


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False

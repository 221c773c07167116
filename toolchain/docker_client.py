"""One place that opens the Docker engine connection, with an actionable error."""
from __future__ import annotations

import errno
import getpass
import os

import docker
from docker.errors import DockerException

from toolchain.errors import ToolchainError

DEFAULT_SOCKET = "/var/run/docker.sock"


def engine() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except DockerException as e:
        raise ToolchainError(_unreachable(e)) from None


def _unreachable(e: DockerException) -> str:
    """What went wrong reaching the engine, and the fix: a socket the user may not open is not a
    stopped engine."""
    host = os.environ.get("DOCKER_HOST", "")
    socket = host.removeprefix("unix://") if host.startswith("unix://") else ("" if host else DEFAULT_SOCKET)
    denied = _denied(e) or "Permission denied" in str(e)
    if socket and denied:
        return (f"cannot reach the Docker engine (Permission denied: the engine runs, but {_user()} may not open "
                f"its socket {socket}); ask to be added to the `docker` group (then log in again), or set "
                "DOCKER_HOST to an engine you may use")
    if socket and not os.path.exists(socket):
        return f"cannot reach the Docker engine ({socket} does not exist); start dockerd, or set DOCKER_HOST to its socket"
    return f"cannot reach the Docker engine ({e}); start dockerd, or set DOCKER_HOST to its socket"


def _user() -> str:
    """The user's name, or `uid N` for a uid with no passwd entry (a container's, a batch job's)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _denied(e: BaseException) -> bool:
    """Whether a PermissionError (EACCES) is in E's chain of causes, contexts or wrapped errors."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "errno", None) == errno.EACCES:  # PermissionError is the OSError of EACCES
            return True
        e = e.__cause__ or e.__context__ or (e.args[0] if e.args and isinstance(e.args[0], BaseException) else None)
    return False


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False

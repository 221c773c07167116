"""The venv's byte-compiled files as a layer of their own, compiled by the image's own interpreter.

Without them every process that imports torch or ray compiles them again, in memory (the image sets
PYTHONDONTWRITEBYTECODE and the venv is read-only to its user): measured here, a 3-node local job's
zygotes needed 130 s instead of seconds to import torch, with the load at 11, and its Ray starts timed out.
`python -m compileall` runs in a container of the image being built, so the bytecode is that
interpreter's whatever the host's Python is; PYTHONPYCACHEPREFIX sends the files to a host directory
(a bind mount, not the container's overlay), from which they are assembled into a layer that puts each
one in its source's __pycache__. Hash-based and unchecked (`--invalidation-mode unchecked-hash`): the
venv never changes under them, and no source mtime is read.
"""
from __future__ import annotations

import os
from pathlib import Path

import docker

from toolchain import layers
from toolchain.errors import BuildError

COMPILE = ["python", "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash"]
PREFIX = "/raytrain-pyc"  # where the container writes them (PYTHONPYCACHEPREFIX)


def compiled_layer(client: docker.DockerClient, image: str, venv: str, out: Path) -> tuple[layers.Layer, int]:
    """Compile VENV's modules in a container of IMAGE; (the layer of their .pyc files, how many did not compile)."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    try:
        client.containers.run(image, [*COMPILE, f"{venv}/lib"], environment={"PYTHONPYCACHEPREFIX": PREFIX},
                              volumes={str(out.resolve()): {"bind": PREFIX, "mode": "rw"}},
                              user=f"{os.getuid()}:{os.getgid()}", network_disabled=True, remove=True)
    except docker.errors.ContainerError as e:
        # exit 1: some modules did not compile (a package's Python 2 test fixtures, say); they compile at
        # import as before, if they are ever imported. Anything else is a failure of the step.
        lines = [l for l in (e.stderr or b"").decode(errors="replace").splitlines() if l.startswith("***")]
        if e.exit_status != 1:
            raise BuildError("bytecode", image, f"compileall exited with {e.exit_status}", lines) from None
        failed = len(lines) or 1
    files = []
    for path in sorted(out.rglob("*.pyc")):
        rel = path.relative_to(out)
        files.append((str(rel.parent / "__pycache__" / rel.name), path.read_bytes(), False))
    if not files:
        raise BuildError("bytecode", image, f"compileall wrote no .pyc files under {venv}/lib", [])
    return layers.make_layer(files), failed

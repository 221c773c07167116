"""The venv's byte-compiled files as a layer of their own, compiled by the image's own interpreter.

Without them every process that imports torch or ray compiles them again, in memory (the image sets
PYTHONDONTWRITEBYTECODE and the venv is read-only to its user): measured here, a 3-node local job's
zygotes needed 130 s instead of seconds to import torch, with the load at 11, and its Ray starts timed out.
`python -m compileall` runs in a container of the image being built, so the bytecode is that
interpreter's whatever the host's Python is; PYTHONPYCACHEPREFIX sends the files to a host directory
(a bind mount, not the container's overlay), from which they are assembled into a layer that puts each
one in its source's __pycache__. Hash-based and unchecked (`--invalidation-mode unchecked-hash`): the
venv never changes under them, and no source mtime is read.

When the host's interpreter writes the image's bytecode (the same magic number, which CPython changes
whenever the .pyc format changes, and the same cache tag), the modules are compiled on the host instead,
by `HostCompiler`, while the venv layer is written: worker processes at a lower priority read the modules
from the wheels from the start and compile them as `compileall` would (the path in the image as the
code's file name, unchecked-hash .pyc), on the core the venv's import into the engine leaves idle, and no
container starts. Either way the layer holds the same files: every .py under the venv's lib/.
"""
from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import zipfile
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import PurePosixPath, Path
from typing import Optional, Sequence

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


BATCH_BYTES = 4 << 20  # sources sent to a worker at once
PLAN_MEMBERS = 400     # a wheel's planned modules compiled by one worker at once
NICE = 5               # below the writer and the engine's import, which the build waits for first


def host_can_compile(magic: str, cache_tag: str) -> bool:
    """The host's interpreter writes .pyc files the image's (magic number MAGIC, cache tag CACHE_TAG) loads."""
    return magic == importlib.util.MAGIC_NUMBER.hex() and cache_tag == sys.implementation.cache_tag


def pyc_name(source: str, cache_tag: str) -> str:
    """Where the image's interpreter looks for the .pyc of SOURCE: its __pycache__/<stem>.<tag>.pyc."""
    p = PurePosixPath(source)
    return str(p.parent / "__pycache__" / f"{p.stem}.{cache_tag}.pyc")


def _worker_start() -> None:
    import warnings
    os.nice(NICE)
    warnings.simplefilter("ignore")  # a package's invalid escape sequences: compileall -q says nothing either


def _compile_batch(batch: list[tuple[str, bytes]]) -> list[tuple[str, Optional[bytes]]]:
    """(tar name, .pyc bytes) for each (tar name, source); None for a source that does not compile."""
    from importlib._bootstrap_external import _code_to_hash_pyc
    out = []
    for name, source in batch:
        try:
            code = compile(source, "/" + name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):  # Python 2 fixtures, null bytes: compiled at import, if ever imported
            out.append((name, None))
            continue
        out.append((name, bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))))
    return out


def _compile_members(wheel: str, members: list[tuple[str, str]]) -> list[tuple[str, Optional[bytes]]]:
    """_compile_batch of the wheel's members (member, tar name), read from the wheel itself."""
    with zipfile.ZipFile(wheel) as z:
        return _compile_batch([(name, z.read(member)) for member, name in members])


class HostCompiler:
    """Compiles the venv's modules on the host's cores, in worker processes, while the layer is written.

    The modules the wheels will put under the venv's lib/ (`planned`: read from the zips' directories,
    toolchain/venv_layer.py `planned_modules`) are compiled from the wheels from the start, so the
    compiling spreads over the whole write instead of trailing it (torch, with half of the modules,
    comes last in name order). The writer tells it each module it wrote (`wants`), and hands over the
    source of any module the plan did not foresee (`add`); `layer` keeps what was written and gives
    the .pyc files as one layer. Only where `host_can_compile` says the image loads the result."""

    def __init__(self, cache_tag: str, workers: Optional[int] = None,
                 planned: Sequence[tuple[Path, list[tuple[str, str]]]] = ()):
        self.cache_tag = cache_tag
        self.pool = ProcessPoolExecutor(workers or os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_worker_start)
        self.batch: list[tuple[str, bytes]] = []
        self.batch_bytes = 0
        self.futures: list[Future] = []
        self.broken: Optional[BaseException] = None
        self.planned: set[str] = set()
        self.written: set[str] = set()
        for wheel, members in planned:
            for i in range(0, len(members), PLAN_MEMBERS):
                self._submit(_compile_members, str(wheel), members[i:i + PLAN_MEMBERS])
            self.planned.update(name for _, name in members)

    def _submit(self, fn, *args) -> None:
        if self.broken is None:
            try:
                self.futures.append(self.pool.submit(fn, *args))
            except BrokenProcessPool as e:  # said by `layer`, not as a failure of the wheel being written
                self.broken = e

    def wants(self, name: str) -> bool:
        """The writer wrote module NAME: True when its source is to be handed over (`add`), the plan
        not having it."""
        self.written.add(name)
        return name not in self.planned

    def add(self, name: str, source: bytes) -> None:
        self.batch.append((name, source))
        self.batch_bytes += len(source)
        if self.batch_bytes >= BATCH_BYTES:
            self._send()

    def _send(self) -> None:
        if self.batch:
            self._submit(_compile_batch, self.batch)
        self.batch, self.batch_bytes = [], 0

    def layer(self) -> tuple[layers.Layer, int]:
        """(the layer of the .pyc of every module written, how many did not compile), once all are compiled."""
        self._send()
        compiled: dict[str, Optional[bytes]] = {}
        try:
            if self.broken is not None:
                raise self.broken
            for f in self.futures:
                compiled.update((name, pyc) for name, pyc in f.result() if name in self.written)
        except Exception as e:  # a worker killed (out of memory, say): the build says so
            raise BuildError("bytecode", "the host's compiler", f"compiling the venv's modules failed: {e}. A script "
                             "that runs the build must start it under `if __name__ == '__main__':` (the workers "
                             "import it)", []) from None
        finally:
            self.close()
        files = [(pyc_name(name, self.cache_tag), pyc, False) for name, pyc in compiled.items() if pyc is not None]
        if not files:
            raise BuildError("bytecode", "the host's compiler", "no module of the venv compiled", [])
        return layers.make_layer(files), len(compiled) - len(files)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

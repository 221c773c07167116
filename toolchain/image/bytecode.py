"""The venv's byte-compiled files: in each dependency layer, or as a layer of their own.

Without them every process that imports torch or ray compiles them again, in memory (the image sets
PYTHONDONTWRITEBYTECODE and the venv is read-only to its user): measured here, a 3-node local job's
zygotes needed 130 s instead of seconds to import torch, with the load at 11, and its Ray starts timed out.

When the host's interpreter writes the image's bytecode (the same magic number, which CPython changes
whenever the .pyc format changes, and the same cache tag), the modules are compiled on the host, by
`HostCompiler`, while the dependency layers are written: worker processes at a lower priority read the
modules from the wheels from the start and compile them as `compileall` would (the path in the image
as the code's file name, unchecked-hash .pyc: the venv never changes under them, and no source mtime
is read), and each wheel's .pyc go into that wheel's layer (toolchain/image/venv_layer.py `LayerWriter`). A
module's .pyc depends only on its source and the compiling Python's version, not on the order or
the process, so a wheel's layer is the same on every machine with the same host Python.

Otherwise (another Python in the base) `python -m compileall` runs in a container of the image being
built, PYTHONPYCACHEPREFIX sending the files to a host directory (a bind mount, not the container's
overlay), from which one layer above the dependency layers puts each in its source's __pycache__.
Either way the image holds the same files: a .pyc for every .py under the venv's lib/.
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

from toolchain.image import layers
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


PLAN_MEMBERS = 400     # a wheel's planned modules compiled by one worker at once
NICE = 5               # below the writer and the engine's load, which the build waits for first
FORMAT = 1             # bump when what the host compile writes changes (the dependency layers' keys)


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


def compile_sources(batch: list[tuple[str, bytes]]) -> dict[str, Optional[bytes]]:
    """{tar name: .pyc bytes} for each (tar name, source); None for a source that does not compile. The
    bytes depend on the source and the compiling Python alone, not on the order or the worker: two
    compiles of one module give the same file (checked: tests/test_venv_layer.py)."""
    from importlib._bootstrap_external import _code_to_hash_pyc
    out: dict[str, Optional[bytes]] = {}
    for name, source in batch:
        try:
            code = compile(source, "/" + name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):  # Python 2 fixtures, null bytes: compiled at import, if ever imported
            out[name] = None
            continue
        out[name] = bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))
    return out


def _compile_members(wheel: str, members: list[tuple[str, str]]) -> dict[str, Optional[bytes]]:
    """compile_sources of the wheel's members (member, tar name), read from the wheel itself."""
    with zipfile.ZipFile(wheel) as z:
        return compile_sources([(name, z.read(member)) for member, name in members])


def identity(magic: str, cache_tag: str) -> Optional[list]:
    """What the host's .pyc bytes depend on, for the dependency layers' keys: the compiling Python's full
    version (two patch releases may write different bytes for one source), magic number and cache tag,
    and how it compiles; None when the host does not write the image's bytecode (`host_can_compile`)."""
    if not host_can_compile(magic, cache_tag):
        return None
    return [sys.version, magic, cache_tag, FORMAT]


class HostCompiler:
    """Compiles the venv's modules on the host's cores, in worker processes, while the layers are written.

    The modules each wheel will put under the venv's lib/ (`planned`: read from the zips' directories,
    toolchain/image/venv_layer.py `planned_modules`) are submitted at the start, in the order the layers are
    written, so the compiling spreads over the whole write instead of trailing it. `of(wheels)` waits
    for the .pyc of those wheels' modules ({tar name: bytes or None}); a layer's writer appends them
    after its files. Only where `host_can_compile` says the image loads the result."""

    def __init__(self, workers: Optional[int] = None, planned: Sequence[tuple[Path, list[tuple[str, str]]]] = ()):
        # fresh processes, however few the modules: marshal writes a name as a back-reference or not by its
        # reference count in the compiling process, so a module compiled in this one (after the tool's
        # imports) gives other .pyc bytes, and another layer, than the same module compiled in a worker
        self.pool = ProcessPoolExecutor(workers or os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_worker_start)
        self.futures: dict[str, list[Future]] = {}
        self.planned: dict[str, set[str]] = {}
        self.broken: Optional[BaseException] = None
        self.add(planned)

    def add(self, planned: Sequence[tuple[Path, list[tuple[str, str]]]]) -> None:
        """Start compiling these wheels' planned modules (wheel, [(member, tar name)])."""
        for wheel, members in planned:
            self.futures[str(wheel)] = [self._submit(str(wheel), members[i:i + PLAN_MEMBERS])
                                        for i in range(0, len(members), PLAN_MEMBERS)]
            self.planned[str(wheel)] = {name for _, name in members}

    def done(self, wheels: Sequence[Path]) -> bool:
        """The wheels' modules are compiled (or their compiling failed: `of` says how)."""
        return all(f is None or f.done() for w in wheels for f in self.futures.get(str(w), []))

    def _submit(self, wheel: str, members: list) -> Optional[Future]:
        if self.broken is None:
            try:
                return self.pool.submit(_compile_members, wheel, members)
            except BrokenProcessPool as e:  # said by `of`, not as a failure of the wheel being written
                self.broken = e
        return None

    def planned_of(self, wheels: Sequence[Path]) -> set[str]:
        return set().union(*(self.planned.get(str(w), set()) for w in wheels))

    def of(self, wheels: Sequence[Path]) -> dict[str, Optional[bytes]]:
        compiled: dict[str, Optional[bytes]] = {}
        try:
            for w in wheels:
                for f in self.futures.get(str(w), []):
                    if f is None:
                        raise self.broken
                    compiled.update(f.result())
        except Exception as e:  # a worker killed (out of memory, say): the build says so
            raise BuildError("bytecode", "the host's compiler", f"compiling the venv's modules failed: {e}. A script "
                             "that runs the build must start it under `if __name__ == '__main__':` (the workers "
                             "import it)", []) from None
        return compiled

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

"""The venv's byte-compiled files: in each dependency layer, or as a layer of their own.

Without them every process that imports torch or ray compiles them again, in memory (the image sets
PYTHONDONTWRITEBYTECODE and the venv is read-only to its user): measured here, a 3-node local job's
zygotes needed 130 s instead of seconds to import torch, with the load at 11, and its Ray starts timed out.

When the host's interpreter writes the image's bytecode (the same magic number, which CPython changes
whenever the .pyc format changes, and the same cache tag), the modules are compiled on the host, by
`HostCompiler`, while the dependency layers are written: worker interpreters at a lower priority
(toolchain/image/pyc_worker.py) read the modules from the wheels from the start and compile them as
`compileall` would (the path in the image as the code's file name, unchecked-hash .pyc: the venv never
changes under them, and no source mtime is read), and each wheel's .pyc go into that wheel's layer
(toolchain/image/venv_layer.py `LayerWriter`). A module's .pyc depends only on its source and the compiling
Python's version, not on the order, the process or what else is installed (the workers are isolated
interpreters: pyc_worker.py says why), so a wheel's layer is the same on every machine with the same
host Python.

Otherwise (another Python in the base) `python -m compileall` runs in a container of the image being
built, PYTHONPYCACHEPREFIX sending the files to a host directory (a bind mount, not the container's
overlay), from which one layer above the dependency layers puts each in its source's __pycache__.
Either way the image holds the same files: a .pyc for every .py under the venv's lib/.
"""
from __future__ import annotations

import importlib.util
import marshal
import os
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
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
FORMAT = 2             # bump when what the host compile writes changes (the dependency layers' keys)
WORKER = Path(__file__).with_name("pyc_worker.py")


def host_can_compile(magic: str, cache_tag: str) -> bool:
    """The host's interpreter writes .pyc files the image's (magic number MAGIC, cache tag CACHE_TAG) loads."""
    return magic == importlib.util.MAGIC_NUMBER.hex() and cache_tag == sys.implementation.cache_tag


def pyc_name(source: str, cache_tag: str) -> str:
    """Where the image's interpreter looks for the .pyc of SOURCE: its __pycache__/<stem>.<tag>.pyc."""
    p = PurePosixPath(source)
    return str(p.parent / "__pycache__" / f"{p.stem}.{cache_tag}.pyc")


class _Worker:
    """One isolated worker interpreter (toolchain/image/pyc_worker.py), asked one batch at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(WORKER), str(NICE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def ask(self, wheel: Optional[str], items: list) -> dict[str, Optional[bytes]]:
        data = marshal.dumps((wheel, items))
        try:
            self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # said below, with its exit status
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            raise RuntimeError(f"a worker interpreter ended with exit status {self.proc.wait()} (out of memory?)")
        answer = marshal.loads(self.proc.stdout.read(struct.unpack(">Q", head)[0]))
        if isinstance(answer, tuple):
            raise RuntimeError(f"{wheel or 'modules the plan did not foresee'}: {answer[1]}")
        return answer

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def _failed(e: Exception) -> BuildError:
    return BuildError("bytecode", "the host's compiler", f"compiling the venv's modules failed: {e}", [])


def identity(magic: str, cache_tag: str) -> Optional[list]:
    """What the host's .pyc bytes depend on, for the dependency layers' keys: the compiling Python's full
    version (two patch releases may write different bytes for one source), magic number and cache tag,
    and how it compiles; None when the host does not write the image's bytecode (`host_can_compile`)."""
    if not host_can_compile(magic, cache_tag):
        return None
    return [sys.version, magic, cache_tag, FORMAT]


class HostCompiler:
    """Compiles the venv's modules on the host's cores, in worker interpreters, while the layers are written.

    The modules each wheel will put under the venv's lib/ (`planned`: read from the zips' directories,
    toolchain/image/venv_layer.py `planned_modules`) are submitted at the start, in the order the layers are
    written, so the compiling spreads over the whole write instead of trailing it. `of(wheels)` waits
    for the .pyc of those wheels' modules ({tar name: bytes or None}); a layer's writer appends them
    after its files, and `compile` those of modules the plan did not foresee. Only where
    `host_can_compile` says the image loads the result."""

    def __init__(self, workers: Optional[int] = None, planned: Sequence[tuple[Path, list[tuple[str, str]]]] = ()):
        # each thread of the pool feeds one worker interpreter, started when the thread takes its first batch
        self.pool = ThreadPoolExecutor(workers or os.cpu_count() or 1, thread_name_prefix="pyc")
        self.local = threading.local()
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self.futures: dict[str, list[Future]] = {}
        self.planned: dict[str, set[str]] = {}
        self.add(planned)

    def _ask(self, wheel: Optional[str], items: list) -> dict[str, Optional[bytes]]:
        worker = getattr(self.local, "worker", None)
        if worker is None:
            worker = self.local.worker = _Worker()
            with self.lock:
                self.workers.append(worker)
        return worker.ask(wheel, items)

    def add(self, planned: Sequence[tuple[Path, list[tuple[str, str]]]]) -> None:
        """Start compiling these wheels' planned modules (wheel, [(member, tar name)])."""
        for wheel, members in planned:
            self.futures[str(wheel)] = [self.pool.submit(self._ask, str(wheel), members[i:i + PLAN_MEMBERS])
                                        for i in range(0, len(members), PLAN_MEMBERS)]
            self.planned[str(wheel)] = {name for _, name in members}

    def done(self, wheels: Sequence[Path]) -> bool:
        """The wheels' modules are compiled (or their compiling failed: `of` says how)."""
        return all(f.done() for w in wheels for f in self.futures.get(str(w), []))

    def planned_of(self, wheels: Sequence[Path]) -> set[str]:
        return set().union(*(self.planned.get(str(w), set()) for w in wheels))

    def of(self, wheels: Sequence[Path]) -> dict[str, Optional[bytes]]:
        compiled: dict[str, Optional[bytes]] = {}
        try:
            for w in wheels:
                for f in self.futures.get(str(w), []):
                    compiled.update(f.result())
        except Exception as e:  # a worker killed (out of memory, say): the build says so
            raise _failed(e) from None
        return compiled

    def compile(self, sources: list[tuple[str, bytes]]) -> dict[str, Optional[bytes]]:
        """{tar name: .pyc bytes or None} of (tar name, source) the plan did not foresee, compiled in a
        worker of the calling thread's own (not behind the planned ones), to the bytes a planned compile gives."""
        try:
            return self._ask(None, sources)
        except Exception as e:  # noqa: BLE001 - as `of`
            raise _failed(e) from None

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker.close()

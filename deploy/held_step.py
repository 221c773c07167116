"""The step that runs one `invoke run` on a held cluster's head, for targets that reach the head
with a command (an srun step, `kubectl exec`): the code goes as a tar on the step's stdin, the head
unpacks it once by its hash (`python -m runtime run --unpack-stdin`, runtime/cluster/serving.py) and the
step's output comes back line by line."""
from __future__ import annotations

import subprocess
import sys
from typing import Optional

from deploy import commands
from runtime import contract as C
from runtime.cluster import log_relay

UNPACK_ROOT = "/tmp"  # where a run's code lies on the head (in its container, where it has one)


def runtime_run(rel_dir: str, argv: list[str], from_stdin: bool = True) -> list[str]:
    """`python -m runtime run` of ARGV in the code at UNPACK_ROOT/REL_DIR, which the step unpacks from its
    stdin (FROM_STDIN) or finds already there (the local target puts it into the container)."""
    unpack = ["--unpack-stdin", UNPACK_ROOT] if from_stdin else []
    return [*C.RUNTIME_CMD, "run", "--code-dir", f"{UNPACK_ROOT}/{rel_dir}", *unpack, "--", *argv]


def runtime_stop() -> list[str]:
    """`python -m runtime stop`: the head stops serving and every node leaves in order (invoke down)."""
    return [*C.RUNTIME_CMD, "stop"]


def stream(step: list[str], env: Optional[dict], code_tar: bytes, out=None, missing: str = "") -> int:
    """Run STEP with CODE_TAR on its stdin and its output relayed to OUT (prefixed `run`); its exit code."""
    out = out or sys.stdout
    try:
        proc = subprocess.Popen([commands.resolve(step[0], env), *step[1:]], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise commands.not_on_path(step[0], missing) from None
    try:
        proc.stdin.write(code_tar)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the step ended early: its output says why
    log_relay.prefixed(proc.stdout, "run", out)
    return proc.wait()

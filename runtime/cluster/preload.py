"""A driver process started while the barrier waits: it imports the heavy modules first, then runs
the user's script once the launcher says go, so the barrier -> first step path does not pay them.

`python train.py ARGS` and `python -m pkg.mod ARGS` (the same interpreter as the launcher's) are
started as `python -m runtime.cluster.preload -- train.py ARGS`: the process imports PRELOAD (ray, torch and
the runtime's worker-group modules; one that fails to import is skipped, the script's own import
reports it), then blocks on a line from stdin. `go` runs the script as `python` would (`__main__`,
sys.argv, sys.path[0] the script's directory); anything else, or EOF, exits without running it. The
user's code therefore starts only after every node is up, as before: what moved is the import
time. Other commands (a shell script, another interpreter) start after the barrier as they are.
"""
from __future__ import annotations

import importlib
import os
import runpy
import shutil
import sys
import threading
from dataclasses import dataclass
from typing import Optional

from runtime import contract as C

PRELOAD = ("ray", "torch", "torch.distributed", "torch.nn.parallel", *C.WORKER_MODULES)
GO = b"go\n"


@dataclass(frozen=True)
class Target:
    """What `python ...` would run: a script path or a module name, and its arguments."""
    script: Optional[str]
    module: Optional[str]
    args: tuple[str, ...]


def same_interpreter(exe: str) -> bool:
    """`exe` is this interpreter (by path, or found on PATH beside it): its site-packages are ours."""
    found = shutil.which(exe)
    if not found or not os.path.basename(found).startswith("python"):
        return False
    return os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable))


def target_of(cmd: list[str]) -> Optional[Target]:
    """The script or module a driver command runs, when it can be preloaded; None otherwise
    (interpreter options, `-c`, another interpreter, not Python at all)."""
    if len(cmd) < 2 or not same_interpreter(cmd[0]):
        return None
    if cmd[1] == "-m" and len(cmd) >= 3 and not cmd[2].startswith("-"):
        return Target(None, cmd[2], tuple(cmd[3:]))
    if not cmd[1].startswith("-") and cmd[1].endswith(".py"):
        return Target(cmd[1], None, tuple(cmd[2:]))
    return None


def preload_argv(target: Target) -> list[str]:
    first = ["-m", target.module] if target.module else [target.script]
    return [sys.executable, "-m", "runtime.cluster.preload", "--", *first, *target.args]


def parse(argv: list[str]) -> Target:
    argv = argv[1:] if argv[:1] == ["--"] else argv
    if argv[:1] == ["-m"]:
        return Target(None, argv[1], tuple(argv[2:]))
    return Target(argv[0], None, tuple(argv[1:]))


# Start-up imports yield to Ray: they run in a thread of their own this much nicer than the process
# (Linux keeps a nice value per thread). The process itself keeps its priority, and so do the
# processes it forks (the zygote's workers) and the script it then runs (the preloaded driver): an
# unprivileged process could never raise its priority again once lowered.
YIELD_NICE = 10


def import_all(names, on_error=None, yield_cpu: bool = True) -> list[str]:
    """Import each of `names` and return those imported; one that fails is skipped (the code that
    needs it imports it again and says what is wrong, where it matters) and passed to on_error.
    `yield_cpu`: in a thread at YIELD_NICE, so that a node's Ray, starting beside, comes first."""
    done: list[str] = []

    def body() -> None:
        if yield_cpu:
            try:
                tid = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + YIELD_NICE))
            except OSError:
                pass  # no per-thread priority here: the imports run at the process's own
        for name in names:
            try:
                importlib.import_module(name)
                done.append(name)
            except Exception as e:
                if on_error:
                    on_error(name, e)
    if not yield_cpu:
        body()
        return done
    worker = threading.Thread(target=body, name="raytrain-imports")
    worker.start()
    worker.join()
    return done


def run(target: Target) -> None:
    from runtime.cluster import ray_train_defaults
    ray_train_defaults.install()  # a driver's Ray Train keeps its checkpoints on the fileroot (no-op elsewhere)
    if target.module:
        sys.argv = [target.module, *target.args]  # run_module puts the module's path in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target.script, *target.args]
        sys.path[0] = os.path.dirname(os.path.realpath(target.script))  # as python does: links resolved
        runpy.run_path(target.script, run_name="__main__")


def main(argv: list[str]) -> int:
    target = parse(argv)
    import_all(PRELOAD)
    if sys.stdin.buffer.readline() != GO:
        return 0
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    run(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

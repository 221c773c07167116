"""Children that die with the launcher, however it ends (SIGKILL included): Linux's parent-death signal.

`tied_to_me()` is a Popen `preexec_fn`: between fork and exec the child asks the kernel for SIGTERM
when its parent goes, then checks that the parent has not gone already (the race before the
request). The signal survives exec, so it holds for `ray start --block` (which stops its node's Ray
processes on SIGTERM), the zygote and the Ray agent. The launcher spawns them from its main thread
and starts no other thread: the kernel sends the signal when the *thread* that forked exits.
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable

_PR_SET_PDEATHSIG = 1


def tied_to_me(sig: int = signal.SIGTERM) -> Callable[[], None]:
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)  # no such guarantee on this kernel: refuse to start an orphan-to-be
        if os.getppid() != parent:
            os._exit(125)  # the launcher died before the request took effect
    return preexec

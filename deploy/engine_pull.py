"""The pushed image pulled into the local engine, where a target runs it from there (the local target, `--sqsh`)
and the engine lacks it: a build made from the registry never loads it (toolchain/image/way.py). Gigabytes,
so its progress is said: a line at most every PROGRESS_EVERY_S seconds."""
from __future__ import annotations

import time
from typing import Callable, Optional

import docker

from runtime.errors import RaytrainError

PROGRESS_EVERY_S = 10.0


class PullError(RaytrainError):
    """The engine did not pull the image (the message is the engine's, with the image named)."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def pull(client, ref: str, progress: Optional[Callable[[str], None]] = None,
         every_s: float = PROGRESS_EVERY_S) -> None:
    """Pull REF (registry/repository@sha256:...) into the engine, saying how much of its layers has come."""
    say = progress or (lambda msg: None)
    say(f"pulling {ref} into the engine (it holds no image of that digest)")
    got: dict[str, tuple[int, int]] = {}   # per layer: (bytes downloaded, its blob's size)
    t0 = last = time.monotonic()
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "error" in event:
                raise PullError(_failed(ref, event["error"]))
            last = _count(event, got, say, t0, last, every_s)
    except docker.errors.APIError as e:  # refused before any layer (no such manifest, no login)
        raise PullError(_failed(ref, e.explanation or e)) from None
    say(f"pulled {ref}: {_mib(sum(c for c, _ in got.values()))} of layers downloaded in {time.monotonic() - t0:.1f}s")


def _failed(ref: str, why) -> str:
    return (f"pulling {ref} into the engine failed: {str(why)[:300]}; check that this machine reaches the registry "
            "and holds its login (`docker login`)")


def _count(event: dict, got: dict, say, t0: float, last: float, every_s: float) -> float:
    """Take one of the engine's pull events into GOT; say the total at most every EVERY_S. The time last said."""
    detail = event.get("progressDetail") or {}
    if event.get("status") == "Downloading" and "current" in detail:
        got[event.get("id", "")] = (int(detail["current"]), int(detail.get("total") or 0))
    elif event.get("status") in ("Download complete", "Pull complete") and event.get("id") in got:
        _, total = got[event["id"]]
        got[event["id"]] = (total, total)
    now = time.monotonic()
    if not got or now - last < every_s:
        return last
    done, total = sum(c for c, _ in got.values()), sum(t for _, t in got.values())
    say(f"pulling: {_mib(done)} of {_mib(total)} of layers downloaded ({now - t0:.0f}s)")
    return now

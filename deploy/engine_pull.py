"""The pushed image in the local engine, where a target runs it from there (the local target, `--sqsh`) and the
engine lacks it: a build made from the registry never loads it (toolchain/image/way.py). First from what this
machine's build left (FromBuild: toolchain/publish/engine_load.py), then by a pull. A pull is gigabytes, so its
progress is said: a line at most every PROGRESS_EVERY_S seconds."""
from __future__ import annotations

import time
from typing import Callable, Optional

import docker

from runtime.errors import RaytrainError

PROGRESS_EVERY_S = 10.0

# puts the pushed image REF (registry/repository@sha256:...) in the engine from this machine's build, saying what
# it does; False where the build left too little of it, or the load failed (said), so a pull is needed
FromBuild = Callable[[docker.DockerClient, str, Callable[[str], None]], bool]


class PullError(RaytrainError):
    """The engine did not pull the image (the message is the engine's, with the image named)."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def pull(client, ref: str, progress: Optional[Callable[[str], None]] = None,
         every_s: float = PROGRESS_EVERY_S) -> None:
    """Pull REF (registry/repository@sha256:...) into the engine, saying how much of its layers has come."""
    say = progress or (lambda msg: None)
    say(f"pulling {ref} into the engine (it holds no image of that digest)")
    got: dict[str, dict[str, tuple[int, int]]] = {"Downloading": {}, "Extracting": {}}  # per layer: (done, size)
    t0 = last = time.monotonic()
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "error" in event:
                raise PullError(_failed(ref, event["error"]))
            last = _count(event, got, say, t0, last, every_s)
    except docker.errors.APIError as e:  # refused before any layer (no such manifest, no login)
        raise PullError(_failed(ref, e.explanation or e)) from None
    say(f"pulled {ref}: {_mib(sum(c for c, _ in got['Downloading'].values()))} of layers downloaded in "
        f"{time.monotonic() - t0:.1f}s")


def image(client, ref: str, progress: Optional[Callable[[str], None]] = None, from_build: Optional[FromBuild] = None):
    """The engine's image REF; where the engine lacks it, loaded from this machine's build (FROM_BUILD), or pulled."""
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        pass
    if from_build is not None and from_build(client, ref, progress or (lambda msg: None)):
        try:
            return client.images.get(ref)
        except docker.errors.ImageNotFound:  # the reference could not be recorded; the pull records it
            pass
    pull(client, ref, progress)
    return client.images.get(ref)


def record(client, ref: str) -> Optional[str]:
    """Make REF (registry/repository@sha256:...) resolve in this engine when it holds the image's config, as
    the engine's own push would have: a pull by digest that finds the config here fetches the manifest and the
    config and nothing else, and records the reference. None when done; otherwise the engine's answer."""
    try:
        client.images.pull(ref)
    except docker.errors.APIError as e:
        return str(e)
    return None


def _failed(ref: str, why) -> str:
    return (f"pulling {ref} into the engine failed: {str(why)[:300]}; check that this machine reaches the registry "
            "and holds its login (`docker login`)")


def _count(event: dict, got: dict, say, t0: float, last: float, every_s: float) -> float:
    """Take one of the engine's pull events into GOT (its layers' blobs downloaded, then extracted: the engine
    applies each one, also one whose files it holds from a load); say both at most every EVERY_S. The time
    last said."""
    status, layer, detail = event.get("status"), event.get("id", ""), event.get("progressDetail") or {}
    if status in got and "current" in detail:
        got[status][layer] = (int(detail["current"]), int(detail.get("total") or 0))
    for stage, complete in (("Downloading", ("Download complete", "Pull complete")), ("Extracting", ("Pull complete",))):
        if status in complete and layer in got[stage]:
            total = got[stage][layer][1]
            got[stage][layer] = (total, total)
    now = time.monotonic()
    if not got["Downloading"] or now - last < every_s:
        return last
    down, ex = got["Downloading"].values(), got["Extracting"].values()
    say(f"pulling: {_mib(sum(c for c, _ in down))} of {_mib(sum(t for _, t in down))} of layers downloaded, "
        f"{_mib(sum(c for c, _ in ex))} extracted ({now - t0:.0f}s)")
    return now

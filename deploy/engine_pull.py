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
    seen = _Progress(say, every_s)
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "error" in event:
                raise PullError(_failed(ref, event["error"]))
            seen.take(event)
    except docker.errors.APIError as e:  # refused before any layer (no such manifest, no login)
        raise PullError(_failed(ref, e.explanation or e)) from None
    say(f"pulled {ref}: {_mib(seen.done('Downloading'))} of layers downloaded in {time.monotonic() - seen.t0:.1f}s")


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


class _Progress:
    """A pull's events taken in: each layer's blob downloaded, then extracted (the engine applies each one, also
    one whose files it holds from a load), per layer (done, size); both said at most every EVERY_S seconds."""

    def __init__(self, say: Callable[[str], None], every_s: float):
        self.say, self.every_s = say, every_s
        self.got: dict[str, dict[str, tuple[int, int]]] = {"Downloading": {}, "Extracting": {}}
        self.t0 = self.last = time.monotonic()

    def done(self, stage: str) -> int:
        return sum(c for c, _ in self.got[stage].values())

    def take(self, event: dict) -> None:
        status, layer, detail = event.get("status"), event.get("id", ""), event.get("progressDetail") or {}
        if status in self.got and "current" in detail:
            self.got[status][layer] = (int(detail["current"]), int(detail.get("total") or 0))
        for stage, complete in (("Downloading", ("Download complete", "Pull complete")),
                                ("Extracting", ("Pull complete",))):
            if status in complete and layer in self.got[stage]:
                total = self.got[stage][layer][1]
                self.got[stage][layer] = (total, total)
        now = time.monotonic()
        if not self.got["Downloading"] or now - self.last < self.every_s:
            return
        self.last = now
        size = sum(t for _, t in self.got["Downloading"].values())
        self.say(f"pulling: {_mib(self.done('Downloading'))} of {_mib(size)} of layers downloaded, "
                 f"{_mib(self.done('Extracting'))} extracted ({now - self.t0:.0f}s)")

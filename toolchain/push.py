"""Push built images to the registry and record their digests.

Only changed layers upload (the registry answers 'Layer already exists' for the rest, so a retry
resumes: what was uploaded is not sent again). Transient failures (5xx, resets, a registry that
restarts, a stalled stream) are retried with backoff; auth failures and a registry that stays
down are reported at once, with the fix. A stall is chosen on purpose: the engine's push stream
silent for `registry.stall_timeout_s` (a slow disk can make it quiet for minutes; longer is a
stuck push). An image that did not fully push, or whose push was interrupted (Ctrl-C), is
neither recorded nor left tagged with the registry name.
"""
from __future__ import annotations

import re
import socket
import time
from dataclasses import asdict, dataclass, field

import docker
import requests
import urllib3

from toolchain.errors import RegistryError, TransientRegistryError
from toolchain.progress import Reporter, human_bytes

_TRANSIENT = re.compile(r"\b5\d\d\b|internal server error|bad gateway|service unavailable|gateway timeout|"
                        r"blob upload unknown|blob upload invalid|"  # a registry restarted mid-upload lost the session

                        r"connection reset|broken pipe|timeout|timed out|unexpected eof|\beof\b", re.I)
_AUTH = re.compile(r"unauthorized|denied|authentication required|forbidden|no basic auth credentials|"
                   r"\b401\b|\b403\b", re.I)
_DOWN = re.compile(r"connection refused|no such host|dial tcp", re.I)


@dataclass
class PushResult:
    variant: str
    target: str
    tag: str
    digest: str
    repo_digest: str
    layers_pushed: int = 0
    layers_existing: int = 0
    bytes_uploaded: int = 0
    attempts: int = 1
    engine_retries: int = 0  # layer uploads the engine itself retried within the attempts
    seconds: float = 0.0
    extra_tags: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class RegistryGone(TransientRegistryError):
    """The registry stopped answering mid-push: retried (it may be restarting), then reported with the fix."""


def classify(message: str) -> RegistryError:
    if _AUTH.search(message):
        return RegistryError(f"{message.strip()} — the registry refused the credentials; run `docker login <registry>` or fix registry.address")
    if _DOWN.search(message):
        return RegistryGone(f"{message.strip()} — the registry is not reachable; start it (`invoke registry.start`) or fix registry.address")
    if _TRANSIENT.search(message):
        return TransientRegistryError(message.strip())
    return RegistryError(message.strip())


class StalledPush(TransientRegistryError):
    """The engine's push stream said nothing for the stall timeout."""


def _push_once(client: docker.DockerClient, target: str, tag: str, rep: Reporter,
               stall_s: float = 300) -> tuple[str, dict, dict, int]:
    """One `docker push`; returns (digest, per-layer bytes pushed, per-layer status, engine retries)."""
    engine_retries = 0
    progress: dict = {}
    totals: dict = {}
    states: dict = {}
    digest = None
    # the engine connection's socket timeout is the stall timeout of the stream
    pusher = docker.from_env(timeout=stall_s).api
    try:
        stream = pusher.push(target, tag=tag, stream=True, decode=True)
        for ev in stream:
            if "error" in ev:
                raise classify(ev.get("errorDetail", {}).get("message") or ev["error"])
            layer, status = ev.get("id"), ev.get("status", "")
            if layer and status:
                states[layer] = status
                detail = ev.get("progressDetail") or {}
                if status == "Pushing" and detail.get("current"):
                    progress[layer] = max(progress.get(layer, 0), int(detail["current"]))
                    totals[layer] = int(detail.get("total") or totals.get(layer, 0))
                if status.startswith("Retrying"):  # the engine's own retry of one layer (it resumes uploads)
                    rep.warn(f"engine: layer {layer}: {status}")
                    engine_retries += 1
                    continue
                if status in ("Pushed", "Layer already exists", "Mounted from") or status.startswith("Mounted"):
                    rep.detail(f"{layer}: {status}" + (f" ({human_bytes(progress[layer])})" if layer in progress else ""))
                elif status == "Pushing":
                    rep.progress(f"uploading {tag}", sum(progress.values()), sum(totals.values()) or None)
            aux = ev.get("aux") or {}
            if "Digest" in aux:
                digest = aux["Digest"]
    except (requests.Timeout, urllib3.exceptions.ReadTimeoutError, socket.timeout) as e:
        raise StalledPush(f"the engine sent no push progress for {stall_s:.0f}s ({type(e).__name__}): a stalled "
                          f"registry or a very slow engine; registry.stall_timeout_s sets how long to wait") from None
    except (requests.ConnectionError, urllib3.exceptions.HTTPError, docker.errors.APIError) as e:
        raise classify(str(e)) from None
    finally:
        rep.progress_done()
        pusher.close()
    if not digest:
        raise TransientRegistryError(f"push of {target}:{tag} ended without a digest")
    return digest, progress, states, engine_retries


def push_image(client: docker.DockerClient, variant: str, image_id: str, target: str, tags: list[str],
               retries: int, backoff: float, rep: Reporter, stall_s: float = 300) -> PushResult:
    """Tag image_id as target:tag for each tag, push, and return the digest of the first tag."""
    created = []
    t0 = time.monotonic()
    try:
        for tag in tags:
            ref = f"{target}:{tag}"
            try:
                client.images.get(ref)
            except docker.errors.ImageNotFound:
                created.append(ref)
            client.api.tag(image_id, target, tag)
        result = None
        for tag in tags:
            attempt = 0
            while True:
                attempt += 1
                rep.step(f"push[{variant}]: {target}:{tag} (attempt {attempt})")
                try:
                    digest, progress, states, engine_retries = _push_once(client, target, tag, rep, stall_s)
                    break
                except TransientRegistryError as e:
                    if attempt > retries:
                        raise RegistryError(f"pushing {target}:{tag} failed after {attempt} attempts: {e}") from None
                    wait = backoff * 2 ** (attempt - 1)
                    rep.warn(f"push {target}:{tag} attempt {attempt} failed ({e}); retrying in {wait:.1f}s "
                             "(layers already uploaded are not sent again)")
                    time.sleep(wait)
            if result is None:
                pushed = [l for l, s in states.items() if s == "Pushed"]
                result = PushResult(
                    variant=variant, target=target, tag=tag, digest=digest, repo_digest=f"{target}@{digest}",
                    layers_pushed=len(pushed),
                    layers_existing=sum(1 for s in states.values() if s == "Layer already exists" or s.startswith("Mounted")),
                    bytes_uploaded=sum(progress.get(l, 0) for l in pushed), attempts=attempt,
                    engine_retries=engine_retries)
            else:
                result.extra_tags.append(tag)
        result.seconds = round(time.monotonic() - t0, 3)
        return result
    except BaseException:  # errors and Ctrl-C alike
        for ref in created:  # leave no half-tagged images behind
            try:
                client.api.remove_image(ref, noprune=True)
            except docker.errors.APIError:
                pass
        raise

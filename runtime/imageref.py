"""ImageRef: an image reference parsed once, with the registry grammar, rendered for each consumer.

Grammar (the distribution project's reference grammar, restricted to sha256 digests):
    reference   := [registry "/"] repository [":" tag] ["@" digest]
    registry    := host [":" port]   host: DNS name, IPv4, or "[" IPv6 "]"; the first path
                   component is a registry when it has a "." or ":", is "localhost", or is "[...]"
    repository  := component ("/" component)*   component: [a-z0-9]+ ([._]|__|-+ [a-z0-9]+)*
    tag         := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest      := "sha256:" 64 lowercase hex digits
Renderings: `docker` (what the engine and Kubernetes take), `pyxis` (`registry#repository@digest`,
what enroot/Pyxis take) and `sqsh_name` (the file name of the image's enroot squashfs).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Optional

from runtime import numbers
from runtime.digest import Digest, DigestError
from runtime.errors import InputError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_LENGTH = 4096


class ImageRefError(InputError):
    """A reference that does not follow the grammar; the message says which part and why."""


def _registry_ok(registry: str) -> bool:
    if registry.startswith("["):
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::([0-9]{1,5}))?", registry)
        if not m:
            return False
        try:
            ipaddress.IPv6Address(m.group(1))
        except ValueError:
            return False
        return m.group(2) is None or 0 < int(m.group(2)) < 65536
    host, colon, port = registry.partition(":")
    if colon and not (numbers.is_whole(port) and 0 < int(port) < 65536):
        return False
    return bool(_HOST.fullmatch(host))


def _is_registry(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost" or first.startswith("[")


@dataclass(frozen=True)
class ImageRef:
    repository: str
    registry: Optional[str] = None
    tag: Optional[str] = None
    digest: Optional[str] = None

    @classmethod
    def parse(cls, text: str, what: str = "image") -> "ImageRef":
        if not isinstance(text, str) or not text:
            raise ImageRefError(f"{what}: empty image reference; give e.g. registry.example.com:5000/team/raytrain-cpu")
        if len(text) > MAX_LENGTH or any(ord(c) < 33 or ord(c) == 127 for c in text):
            raise ImageRefError(f"{what}: {text[:80]!r} has spaces, control characters or is too long")
        if "://" in text:
            raise ImageRefError(f"{what}: {text[:120]!r} has a URL scheme; give the registry as host[:port] "
                                "(plain HTTP or TLS is the engine's business, not the reference's)")
        rest, digest = text, None
        if "@" in rest:
            rest, _, digest = rest.partition("@")
            try:
                digest = Digest(digest)
            except DigestError:
                raise ImageRefError(f"{what}: digest {digest[:80]!r} in {text[:120]!r} is not sha256: followed by "
                                    "64 lowercase hex digits") from None
        registry = None
        first, sep, remainder = rest.partition("/")
        if sep and _is_registry(first):
            if not _registry_ok(first):
                raise ImageRefError(f"{what}: registry {first!r} in {text[:120]!r} is not host[:port] "
                                    "(a DNS name, an IPv4 address or [IPv6], port 1-65535); no scheme such as http://")
            registry, rest = first, remainder
        tag = None
        last_slash = rest.rfind("/")
        if ":" in rest[last_slash + 1:]:
            rest, _, tag = rest.rpartition(":")
            if not _TAG.fullmatch(tag):
                raise ImageRefError(f"{what}: tag {tag[:80]!r} in {text[:120]!r} must be letters, digits, '_', '.' "
                                    "and '-' (at most 128, not starting with '.' or '-')")
        if not _REPOSITORY.fullmatch(rest):
            raise ImageRefError(f"{what}: repository {rest[:80]!r} in {text[:120]!r} must be lowercase letters and "
                                "digits separated by '.', '_', '__', '-' or '/' (e.g. team/raytrain-cpu)")
        return cls(rest, registry, tag, digest)

    # -- properties ----------------------------------------------------------------
    @property
    def name(self) -> str:
        """registry/repository (no tag or digest)."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def loopback(self) -> bool:
        """In a registry only this machine can reach (localhost, 127.0.0.0/8, ::1)."""
        if not self.registry:
            return False
        host = self.registry[1:].split("]", 1)[0] if self.registry.startswith("[") else self.registry.split(":")[0]
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    # -- renderings ----------------------------------------------------------------
    def docker(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def pyxis(self) -> str:
        """enroot's form: `registry#repository@digest` (the registry is split off with '#')."""
        self.require_pinned()
        where = f"{self.registry}#{self.repository}" if self.registry else self.repository
        return f"{where}@{self.digest}"

    def sqsh_name(self) -> str:
        """'raytrain-cpu+sha256-<hex>.sqsh': no '@' or ':', which Pyxis would read as a registry image."""
        self.require_pinned()
        return f"{self.repository.rsplit('/', 1)[-1]}+sha256-{Digest(self.digest).hex}.sqsh"

    def at(self, digest: str) -> "ImageRef":
        """This repository pinned by DIGEST (what a push of it made), without a tag."""
        return ImageRef(self.repository, self.registry, None, Digest(digest, f"digest of {self.name}"))

    def require_pinned(self) -> "ImageRef":
        if not self.pinned:
            raise ImageRefError(f"image {self.docker()!r} is not pinned by digest (repository@sha256:...); "
                                "run `invoke build push` first")
        return self

    def __str__(self) -> str:
        return self.docker()

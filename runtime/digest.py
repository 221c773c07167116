"""A content digest: the sha256 of some bytes, as images name their layers, configs, blobs and manifests.

One value type, made where bytes are hashed or where a digest arrives as text (the engine's API, a
record, a registry's header), and passed on as it is. `.hex` (a file name in a store) and `.short`
(the 12 hex digits people read) are the only ways code takes one apart, and `from_hex` the only way
one is put together. It is a `str` whose text is the canonical `sha256:<64 hex>`, so it goes as it is
wherever text goes: JSON, the engine's API, a URL, a dict key beside digests read as plain text.
"""
from __future__ import annotations

import hashlib
import re

from runtime.errors import InputError

PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{64}")


class DigestError(InputError):
    """Text that is not a sha256 digest; the message says whose and what it was."""


class Digest(str):
    __slots__ = ()

    def __new__(cls, text: str, what: str = "digest") -> "Digest":
        if type(text) is cls:
            return text
        if not isinstance(text, str) or not PATTERN.fullmatch(text):
            raise DigestError(f"{what}: {str(text)[:80]!r} is not a sha256 digest ('sha256:' and 64 lowercase hex digits)")
        return super().__new__(cls, text)

    @classmethod
    def from_hex(cls, hex_: str, what: str = "digest") -> "Digest":
        if not isinstance(hex_, str) or not _HEX.fullmatch(hex_):
            raise DigestError(f"{what}: {str(hex_)[:80]!r} is not 64 lowercase hex digits")
        return super().__new__(cls, "sha256:" + hex_)

    @classmethod
    def of(cls, data: bytes) -> "Digest":
        return cls.from_hex(hashlib.sha256(data).hexdigest())

    @classmethod
    def of_hash(cls, h: "hashlib._Hash") -> "Digest":
        """The digest a finished sha256 object says."""
        if h.name != "sha256":
            raise ValueError(f"a {h.name} hash is not a sha256 digest")
        return cls.from_hex(h.hexdigest())

    @property
    def hex(self) -> str:
        return self[7:]

    @property
    def short(self) -> str:
        return self[7:19]

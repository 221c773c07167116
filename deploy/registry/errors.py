"""A registry's failures, typed by what the answer said (its HTTP status and the distribution spec's
error codes), as go-containerregistry's `transport.Error` types them, never by the words of a message.

    Unauthorized    401/403, or UNAUTHORIZED/DENIED: the login is missing or refused (not retried)
    NotFound        404, or MANIFEST_UNKNOWN/BLOB_UNKNOWN/NAME_UNKNOWN: the registry lacks it
    Transient       408, 429, 5xx, or a code the spec calls temporary (a restarted registry's lost
                    upload session): retried by the push
    RegistryGone    no connection (refused, no such host): retried, then reported with the fix
    Stalled         no byte moved for the stall timeout: retried
    RegistryError   anything else (a bad answer, a redirect off the registry): reported at once
"""
from __future__ import annotations

from typing import Optional

from runtime.errors import RaytrainError

TEMPORARY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TEMPORARY_CODES = frozenset({"BLOB_UPLOAD_INVALID", "BLOB_UPLOAD_UNKNOWN", "TOOMANYREQUESTS", "UNAVAILABLE"})
AUTH_CODES = frozenset({"UNAUTHORIZED", "DENIED"})
MISSING_CODES = frozenset({"MANIFEST_UNKNOWN", "BLOB_UNKNOWN", "NAME_UNKNOWN"})


class RegistryError(RaytrainError):
    """The registry could not be started or reached, or refused what was asked (exit code 1).
    `status` and `codes` are the answer's, where there was one."""

    def __init__(self, message: str, status: Optional[int] = None, codes: tuple[str, ...] = ()):
        super().__init__(message)
        self.status, self.codes = status, codes


class TransientRegistryError(RegistryError):
    """Worth retrying: 5xx, 429, a reset connection, a lost upload session."""


class Unauthorized(RegistryError):
    """The registry wants a login it did not get, or refused the one given."""


class NotFound(RegistryError):
    """The registry does not hold the manifest or blob asked for."""


class RegistryGone(TransientRegistryError):
    """The registry stopped answering (refused, no such host): retried (it may be restarting), then
    reported with the fix."""


class Stalled(TransientRegistryError):
    """No byte went to or came from the registry for the stall timeout."""


def kind_of(status: int, codes: tuple[str, ...]) -> type[RegistryError]:
    """The error type an answer with STATUS and the registry's error CODES stands for."""
    if status in (401, 403) or AUTH_CODES.intersection(codes):
        return Unauthorized
    if status in TEMPORARY_STATUS or TEMPORARY_CODES.intersection(codes):
        return TransientRegistryError
    if status == 404 or MISSING_CODES.intersection(codes):
        return NotFound
    return RegistryError

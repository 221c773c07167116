"""Where a registry is and how it is spoken to: loopback or not, TLS or plain HTTP, up or not, and
which certificates its TLS is checked against (the engine's /etc/docker/certs.d). Nothing here turns
certificate checks off: a handshake that fails on an untrusted certificate still says the registry
speaks TLS and is up."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import requests

from deploy.registry.deadline import answer_within, watched_session
from runtime.errors import InputError
from runtime.imageref import ImageRef

CERTS_D = Path("/etc/docker/certs.d")


def is_local(address: str) -> bool:
    """A registry on this machine (localhost, 127.0.0.0/8, [::1]): the engine's insecure-registry rule."""
    try:
        return ImageRef.parse(f"{address.rstrip('/')}/x", "registry.address").loopback
    except InputError:
        return False


def tls_settings(host: str) -> tuple[object, Optional[tuple[str, str]]]:
    """(requests' verify, client certificate) for a registry host, from /etc/docker/certs.d like the engine:
    its ca.crt, else the system store; a loopback registry without one is not verified (the engine treats
    127.0.0.0/8 as an insecure registry by default)."""
    d = CERTS_D / host
    cert = (str(d / "client.cert"), str(d / "client.key")) if (d / "client.cert").is_file() else None
    if (d / "ca.crt").is_file():
        return str(d / "ca.crt"), cert
    return (not is_local(host)), cert


def _status(url: str, timeout: float, **kw) -> int:
    """The status of GET URL: its headers whole within TIMEOUT however they trickle (deadline.py), its body
    never read (an endless or deflate-bomb answer costs nothing); requests' errors pass through."""
    import warnings
    session = watched_session()
    try:
        with answer_within(timeout) as watch, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unverified loopback registry, as the engine allows
            r = session.get(url, timeout=timeout, allow_redirects=False, stream=True, **kw)
            r.close()
        if watch.fired:
            raise requests.exceptions.ReadTimeout(f"{url}: no whole answer within {timeout:.0f}s")
        return r.status_code
    finally:
        session.close()


def _untrusted(e: requests.exceptions.SSLError) -> bool:
    """A TLS handshake that got as far as the certificate (the registry speaks TLS)."""
    text = str(e).lower()
    return "certificate" in text or "hostname" in text


def _tls(host: str, timeout: float) -> Optional[int]:
    """The status of GET https://HOST/v2/ (TLS checked as the engine checks it); 0 when TLS was spoken
    but its certificate is not trusted here; None when no TLS answered."""
    verify, cert = tls_settings(host)
    try:
        return _status(f"https://{host}/v2/", timeout, verify=verify, cert=cert)
    except requests.exceptions.SSLError as e:
        return 0 if _untrusted(e) else None
    except requests.RequestException:
        return None


def ping(address: str, timeout: float = 2.0) -> bool:
    """A registry answers /v2/ (200, or 401 when it wants a login), over TLS or plain HTTP."""
    host = address.split("/")[0]
    try:
        if _status(f"http://{host}/v2/", timeout) in (200, 401):
            return True
    except requests.RequestException:
        pass
    return _tls(host, timeout) in (0, 200, 401)


def scheme(address: str, timeout: float = 3.0) -> str:
    """'https' when the registry speaks TLS on /v2/, else 'http' (what the engine fell back to), or
    'unknown' when nothing answers.

    Recorded with each push: enroot refuses plain-HTTP registries unless the site allows them.
    """
    host = address.split("/")[0]
    if _tls(host, timeout) is not None:
        return "https"
    return "http" if ping(address, timeout) else "unknown"

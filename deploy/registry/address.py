"""Where a registry is and how it is spoken to: loopback or not, TLS or plain HTTP, up or not."""
from __future__ import annotations

import warnings

import requests

from runtime.errors import InputError
from runtime.imageref import ImageRef


def is_local(address: str) -> bool:
    """A registry on this machine (localhost, 127.0.0.0/8, [::1]): the engine's insecure-registry rule."""
    try:
        return ImageRef.parse(f"{address.rstrip('/')}/x", "registry.address").loopback
    except InputError:
        return False


def ping(address: str, timeout: float = 2.0) -> bool:
    """A registry answers /v2/ (200, or 401 when it wants a login), over TLS or plain HTTP."""
    host = address.split("/")[0]
    for url in (f"http://{host}/v2/", f"https://{host}/v2/"):
        try:
            with warnings.catch_warnings():  # liveness only: the engine checks the certificate when it pushes
                warnings.simplefilter("ignore")
                if requests.get(url, timeout=timeout, verify=False, allow_redirects=False).status_code in (200, 401):
                    return True
        except requests.RequestException:
            pass
    return False


def scheme(address: str, timeout: float = 3.0) -> str:
    """'https' when the registry completes a TLS handshake on /v2/, else 'http' (what the engine fell back to).

    Recorded with each push: enroot refuses plain-HTTP registries unless the site allows them.
    """
    host = address.split("/")[0]
    try:
        with warnings.catch_warnings():  # a self-signed certificate still means TLS; only the scheme is asked
            warnings.simplefilter("ignore")
            requests.get(f"https://{host}/v2/", timeout=timeout, verify=False, allow_redirects=False)
        return "https"
    except requests.exceptions.SSLError:
        return "http"
    except requests.RequestException:
        return "http" if ping(address, timeout) else "unknown"

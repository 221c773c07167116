"""The registry's HTTP API (distribution v2 / OCI distribution spec) for a push: blobs and manifests.

The engine's rules, so that what `docker push` reached this reaches too:
  scheme  a loopback registry (localhost, 127.0.0.0/8, ::1) is asked over TLS first and plain HTTP
          when TLS does not answer (toolchain/registry.py `scheme`); any other registry over HTTPS.
  TLS     verified against /etc/docker/certs.d/<host:port>/ca.crt when it exists (client.cert and
          client.key there too), else the system store; a loopback registry without one is not
          verified (the engine treats 127.0.0.0/8 as an insecure registry by default).
  login   the Docker CLI's config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json):
          credHelpers[host], then auths[host].auth, then credsStore; a 401 challenge is answered
          with Basic credentials or a Bearer token fetched from its realm.
Failures are the push's errors (toolchain/push.py `classify`): credentials refused, registry gone,
transient (5xx, resets), stalled (no byte moved for stall_s). Credentials and tokens are never
written to a message or a log.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import warnings
from pathlib import Path
from typing import Callable, Iterable, Optional
from urllib.parse import urljoin, urlsplit

import requests

from toolchain.errors import RegistryError, TransientRegistryError
from toolchain.registry import is_local, ping, scheme

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CERTS_D = Path("/etc/docker/certs.d")
CONNECT_S = 10.0
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class StalledPush(TransientRegistryError):
    """No byte went to or came from the registry for the stall timeout."""


class RegistryGone(TransientRegistryError):
    """The registry stopped answering mid-push: retried (it may be restarting), then reported with the fix."""


_TRANSIENT = re.compile(r"\b5\d\d\b|internal server error|bad gateway|service unavailable|gateway timeout|"
                        r"blob upload unknown|blob upload invalid|"  # a registry restarted mid-upload lost the session
                        r"connection reset|broken pipe|connection aborted|remote end closed|"
                        r"timeout|timed out|unexpected eof|\beof\b", re.I)
_AUTH = re.compile(r"unauthorized|denied|authentication required|forbidden|no basic auth credentials|"
                   r"\b401\b|\b403\b", re.I)
_DOWN = re.compile(r"connection refused|no such host|dial tcp|name or service not known|"
                   r"temporary failure in name resolution", re.I)


def classify(message: str, registry: str = "<registry>") -> RegistryError:
    """The error a registry's answer or a connection failure stands for: credentials refused (at once,
    with the fix), the registry gone, transient (retried), or anything else (at once)."""
    if _AUTH.search(message):
        return RegistryError(f"{message.strip()} — the registry refused the credentials; "
                             f"run `docker login {registry}` or fix registry.address")
    if _DOWN.search(message):
        return RegistryGone(f"{message.strip()} — the registry is not reachable; start it (`invoke registry.start`) "
                            "or fix registry.address")
    if _TRANSIENT.search(message):
        return TransientRegistryError(message.strip())
    return RegistryError(message.strip())


def docker_config() -> tuple[Path, dict]:
    d = os.environ.get("DOCKER_CONFIG")
    path = Path(d) / "config.json" if d else Path.home() / ".docker" / "config.json"
    try:
        return path, json.loads(path.read_text())
    except FileNotFoundError:
        return path, {}
    except (OSError, ValueError) as e:
        raise RegistryError(f"{path}: not readable as the Docker config ({type(e).__name__}); fix it, or remove it "
                            "and log in again (`docker login <registry>`)") from None


def _helper(name: str, host: str) -> Optional[tuple[str, str]]:
    binary = f"docker-credential-{name}"
    try:
        out = subprocess.run([binary, "get"], input=host, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise RegistryError(f"the Docker config names the credential helper {name!r} but {binary} is not on PATH; "
                            f"install it or remove it from the config") from None
    except subprocess.TimeoutExpired:
        raise RegistryError(f"{binary} get did not answer within 60 s for {host}") from None
    if out.returncode != 0:
        if "not found" in (out.stdout + out.stderr).lower():
            return None
        raise RegistryError(f"{binary} get failed for {host} (exit {out.returncode}); run `docker login {host}`")
    try:
        doc = json.loads(out.stdout)
        return doc["Username"], doc["Secret"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{binary} get gave no Username/Secret for {host}") from None


def credentials(host: str) -> Optional[tuple[str, str]]:
    """(user, password) for a registry host from the Docker CLI's config, as the engine's client gets them."""
    path, cfg = docker_config()
    helper = (cfg.get("credHelpers") or {}).get(host)
    if helper:
        return _helper(helper, host)
    for key, entry in (cfg.get("auths") or {}).items():
        if key.split("://")[-1].split("/")[0] == host and isinstance(entry, dict) and entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RegistryError(f"{path}: the login for {host} is not base64 of user:password; "
                                    f"run `docker login {host}` again") from None
            return user, password
    if cfg.get("credsStore"):
        return _helper(cfg["credsStore"], host)
    return None


def tls_settings(host: str) -> tuple[object, Optional[tuple[str, str]]]:
    """(requests' verify, client certificate) for a registry host, from /etc/docker/certs.d like the engine."""
    d = CERTS_D / host
    cert = (str(d / "client.cert"), str(d / "client.key")) if (d / "client.cert").is_file() else None
    if (d / "ca.crt").is_file():
        return str(d / "ca.crt"), cert
    return (not is_local(host)), cert


class FileBody:
    """A blob file sent as a request body in 1 MiB pieces (never read whole), its length known up front;
    `digest` is the sha256 of what was sent once all of it was (None before)."""

    def __init__(self, path: Path, size: int, sent: Callable[[int], None]):
        self.path, self.size, self.sent = path, size, sent
        self.digest: Optional[str] = None

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterable[bytes]:
        h, n = hashlib.sha256(), 0
        with open(self.path, "rb") as f:
            while data := f.read(1 << 20):
                h.update(data)
                n += len(data)
                yield data
                self.sent(len(data))
        self.digest = "sha256:" + h.hexdigest() if n == self.size else None


class RegistryClient:
    """One repository of one registry, for one push attempt."""

    def __init__(self, address: str, repo: str, stall_s: float, mount_from: Iterable[str] = ()):
        self.host = address.split("/")[0]
        self.repo, self.stall_s = repo, stall_s
        self.mount_from = [r for r in mount_from if r != repo]
        found = scheme(self.host) if is_local(self.host) else "https"
        self.base = f"{'https' if found == 'https' else 'http'}://{self.host}"
        self.session = requests.Session()
        # passed with each request: a Session's own verify loses to REQUESTS_CA_BUNDLE in the environment
        self.verify, self.cert = tls_settings(self.host)
        # like the engine (Go's ProxyFromEnvironment), never through an HTTP(S)_PROXY to a loopback registry
        self.proxies = {"http": None, "https": None, "all": None} if is_local(self.host) else None
        self._authenticated = False

    def close(self) -> None:
        self.session.close()

    # -- requests ---------------------------------------------------------------------------------
    def _request(self, method: str, url: str, what: str, body: Optional[Callable[[], object]] = None,
                 **kw) -> requests.Response:
        url = urljoin(self.base + "/", url)
        for round_ in (1, 2):
            try:
                with warnings.catch_warnings():  # an unverified loopback registry, as the engine allows
                    warnings.simplefilter("ignore")
                    r = self.session.request(method, url, data=body() if body else None, verify=self.verify,
                                             cert=self.cert, proxies=self.proxies, timeout=(CONNECT_S, self.stall_s),
                                             allow_redirects=method in ("GET", "HEAD"), **kw)
            except requests.exceptions.SSLError as e:
                raise RegistryError(f"{what}: TLS with {self.host} failed ({_reason(e)}); put the registry's CA "
                                    f"certificate at {CERTS_D / self.host / 'ca.crt'}") from None
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectTimeout):
                raise self._stalled(what) from None
            except requests.exceptions.ConnectionError as e:
                reason = _reason(e)
                if "timed out" in reason.lower():
                    raise self._stalled(what) from None
                err = classify(f"{what}: {reason}", self.host)
                if not isinstance(err, RegistryGone) and not ping(self.host, timeout=2):  # it went away mid-transfer
                    err = classify(f"{what}: {reason}, and {self.host} now refuses connections (connection refused)",
                                   self.host)
                raise err if type(err) is not RegistryError else TransientRegistryError(err.args[0]) from None
            if r.status_code == 401 and round_ == 1:
                self._authenticate(r)
                continue
            return r
        return r

    def _stalled(self, what: str) -> StalledPush:
        return StalledPush(f"{what}: the registry {self.host} made no push progress for {self.stall_s:.0f}s (a stalled "
                           "registry or network); registry.stall_timeout_s sets how long to wait")

    def _fail(self, r: requests.Response, what: str) -> RegistryError:
        detail = ""
        try:
            errors = r.json().get("errors") or []
            detail = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
        except (ValueError, AttributeError):
            pass
        msg = f"{what}: the registry answered HTTP {r.status_code} {r.reason or ''}".rstrip()
        msg += f" ({detail})" if detail else ""
        if r.status_code == 401:
            who = "with no login" if credentials(self.host) is None else "with the login in the Docker config"
            msg += f", {who}"
        return classify(msg, self.host)

    def _authenticate(self, r: requests.Response) -> None:
        """Answer a 401 challenge (Basic or Bearer); without usable credentials, the auth error with the fix."""
        challenge = r.headers.get("WWW-Authenticate", "")
        kind = challenge.split(" ", 1)[0].lower()
        creds = credentials(self.host)
        if kind == "basic":
            if creds is None:
                raise self._fail(r, f"log in to {self.host}")
            self.session.auth = creds
            return
        if kind == "bearer":
            params = dict(_CHALLENGE_PARAM.findall(challenge))
            realm = params.pop("realm", None)
            if not realm:
                raise RegistryError(f"{self.host} asked for a Bearer token without a realm ({challenge[:200]!r})")
            params["scope"] = [params["scope"]] if params.get("scope") else [
                f"repository:{self.repo}:pull,push", *(f"repository:{r}:pull" for r in self.mount_from)]
            realm_host = urlsplit(realm).netloc
            verify, cert = tls_settings(realm_host)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t = requests.get(realm, params=params, auth=creds, verify=verify, cert=cert,
                                     timeout=(CONNECT_S, self.stall_s))
            except requests.RequestException as e:
                raise classify(f"getting a token from {realm_host} for {self.host}: {_reason(e)}", self.host) from None
            if t.status_code != 200:
                raise self._fail(t, f"getting a token from {realm_host} for {self.host}")
            try:
                token = t.json().get("token") or t.json().get("access_token")
            except ValueError:
                token = None
            if not token:
                raise RegistryError(f"the token service {realm_host} gave no token for {self.host}")
            self.session.auth = None
            self.session.headers["Authorization"] = f"Bearer {token}"
            return
        raise self._fail(r, f"log in to {self.host} (challenge {kind or 'none'})")

    # -- the API --------------------------------------------------------------------------------------
    def check(self) -> None:
        """GET /v2/: the registry answers and takes this login (answering its challenge)."""
        r = self._request("GET", "/v2/", f"reaching {self.host}")
        if r.status_code != 200:
            raise self._fail(r, f"reaching {self.host}")

    def has_blob(self, digest: str) -> bool:
        r = self._request("HEAD", f"/v2/{self.repo}/blobs/{digest}", f"asking for blob {digest[7:19]}")
        if r.status_code == 200:
            return True
        if r.status_code == 404:
            return False
        raise self._fail(r, f"asking for blob {digest[7:19]}")

    def mount(self, digest: str, other: str) -> bool:
        """Mount a blob from another repository of this registry (no bytes sent): True when it was.
        Asked only where that repository has it, so no upload session is left open otherwise."""
        if other == self.repo:
            return False
        r = self._request("HEAD", f"/v2/{other}/blobs/{digest}", f"asking {other} for blob {digest[7:19]}")
        if r.status_code != 200:
            return False
        r = self._request("POST", f"/v2/{self.repo}/blobs/uploads/", f"mounting blob {digest[7:19]} from {other}",
                          params={"mount": digest, "from": other})
        if r.status_code == 201:
            return True
        if r.status_code == 202 and r.headers.get("Location"):  # not mounted: drop the upload session it opened
            self.cancel_upload(urljoin(self.base + "/", r.headers["Location"]))
            return False
        raise self._fail(r, f"mounting blob {digest[7:19]} from {other}")

    def _start_upload(self, what: str) -> str:
        """POST an upload session; its Location (relative or absolute, its query kept)."""
        r = self._request("POST", f"/v2/{self.repo}/blobs/uploads/", f"starting the upload of {what}")
        if r.status_code != 202 or not r.headers.get("Location"):
            raise self._fail(r, f"starting the upload of {what}")
        return urljoin(self.base + "/", r.headers["Location"])

    def upload(self, digest: str, body: Callable[[], object], size: int, what: str) -> None:
        """An upload session, then one PUT of the whole blob at its Location with ?digest=."""
        r = self._request("PUT", self._start_upload(what), f"uploading {what}", body=body, params={"digest": digest},
                          headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if r.status_code != 201:
            raise self._fail(r, f"uploading {what}")

    def upload_stream(self, chunks: Iterable[bytes], what: str) -> str:
        """An upload session PATCHed the blob as it is made (chunked: its size and digest are not known
        yet); the session's Location for `finish_upload`. The engine's own push uploads so."""
        r = self._request("PATCH", self._start_upload(what), f"uploading {what}", body=lambda: chunks,
                          headers={"Content-Type": "application/octet-stream"})
        if r.status_code != 202 or not r.headers.get("Location"):
            raise self._fail(r, f"uploading {what}")
        return urljoin(self.base + "/", r.headers["Location"])

    def finish_upload(self, location: str, digest: str, what: str) -> None:
        """Close a streamed upload: the registry checks the bytes it got against DIGEST."""
        r = self._request("PUT", location, f"finishing the upload of {what}", params={"digest": digest},
                          headers={"Content-Length": "0"})
        if r.status_code != 201:
            raise self._fail(r, f"finishing the upload of {what}")

    def cancel_upload(self, location: str) -> None:
        """Drop an upload session whose bytes are not to be kept (best effort: the registry expires it anyway)."""
        try:
            self._request("DELETE", location, "cancelling an upload")
        except RegistryError:
            pass

    def put_manifest(self, tag: str, manifest: bytes) -> str:
        """PUT the manifest under tag; its digest (sha256 of these bytes), checked against the registry's."""
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        r = self._request("PUT", f"/v2/{self.repo}/manifests/{tag}", f"putting the manifest of {self.repo}:{tag}",
                          body=lambda: manifest, headers={"Content-Type": MANIFEST_V2})
        if r.status_code != 201:
            raise self._fail(r, f"putting the manifest of {self.repo}:{tag}")
        said = r.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise RegistryError(f"{self.host} stored the manifest of {self.repo}:{tag} as {said}, not as the sha256 "
                                f"of the bytes sent ({digest}); the registry rewrote it")
        return digest


def manifest(config: bytes, layers: list[tuple[str, int]]) -> bytes:
    """A Docker schema2 manifest: the config blob and the gzip layers (digest, size), in order."""
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_V2,
           "config": {"mediaType": CONFIG_V1, "size": len(config), "digest": config_digest},
           "layers": [{"mediaType": LAYER_GZIP, "size": size, "digest": digest} for digest, size in layers]}
    return json.dumps(doc, indent=3).encode()


def _reason(e: BaseException) -> str:
    """The innermost useful words of a requests/urllib3 error (no URL with a query, no credentials)."""
    text = str(e)
    inner = re.findall(r"\[Errno -?\d+\] [^'\")]+|Connection refused|Connection reset by peer|Broken pipe|"
                       r"Remote end closed connection without response|timed out|"
                       r"certificate verify failed[^'\")]*|EOF occurred[^'\")]*", text)
    return inner[-1] if inner else type(e).__name__

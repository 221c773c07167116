"""One repository of one registry, over its HTTP API (distribution v2 / OCI distribution spec).

The engine's rules, so that what `docker push` and a node's pull reach, this reaches too:
  scheme       a loopback registry (localhost, 127.0.0.0/8, ::1) is asked over TLS first and plain
               HTTP when TLS does not answer (address.scheme); any other registry over HTTPS
  TLS          verified against /etc/docker/certs.d/<host:port>/ca.crt when it exists (client.cert
               and client.key there too), else the system store; a loopback registry without one
               is not verified (the engine treats 127.0.0.0/8 as an insecure registry by default)
  login        auth.credentials; a 401 challenge is answered with Basic or a Bearer token from
               the realm it names (auth.parse_challenge)
  credentials  the login and the token go only to the registry's own origin (scheme, host and
               port) and the login to the token realm its challenge names, as go-containerregistry
               and the Docker CLI send them: an upload Location, a redirect or a mount answer that
               points elsewhere is followed without them. Only http and https URLs are followed,
               at most MAX_REDIRECTS redirects
  answers      read up to MAX_ANSWER bytes, the whole answer (headers and body) within the stall
               timeout of the request having been sent (deadline.answer_within: a registry that
               trickles a byte a second is cut off); errors typed by status and the registry's codes
               (errors.kind_of), the registry's words shown without control characters
Credentials and tokens are never written to a message or a log.
"""
from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Mapping, Optional, TypeVar
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

from runtime.digest import Digest
from deploy import hint
from deploy.registry import auth
from deploy.registry.address import CERTS_D, is_local, ping, scheme as probe_scheme, tls_settings
from deploy.registry.deadline import answer_within, watched_session
from deploy.registry.errors import (RegistryError, RegistryGone, Stalled, TransientRegistryError, Unauthorized,
                                    kind_of)

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
ACCEPT_MANIFESTS = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                              "application/vnd.docker.distribution.manifest.list.v2+json", MANIFEST_V2])
CONNECT_S = 10.0
MAX_ANSWER = 1 << 20  # bytes of a registry's or token service's answer read (an error, a token): never more
MAX_REDIRECTS = 5
MAX_TOKEN = 16 << 10
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_TOKEN_CHARS = re.compile(r"[!-~]+")  # printable ASCII, no space: what goes into a header


def shown(text: object, limit: int = 300) -> str:
    """A registry's words as they may be printed: no control characters (ANSI escapes, CR LF), bounded."""
    return _CONTROL.sub(" ", str(text))[:limit].strip()


@dataclass
class Answer:
    """A registry's answer: its status, headers and at most MAX_ANSWER bytes of its body."""
    status_code: int
    reason: str
    headers: Mapping[str, str]
    body: bytes = b""
    url: str = ""
    truncated: bool = False
    _doc: object = field(default=None, repr=False)
    consumed: object = field(default=None, repr=False)  # _exchange's CONSUME: (its result, the body's digest)

    def json(self) -> object:
        """The body as JSON; ValueError when it is not (or was cut at MAX_ANSWER, or nests too deep)."""
        if self.truncated:
            raise ValueError("the answer is longer than the client reads")
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("the answer nests too deep") from None

    def error_codes(self) -> tuple[tuple[str, str], ...]:
        """(code, message) of the distribution spec's `errors` list, where the body has one."""
        try:
            doc = self.json()
        except ValueError:
            return ()
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if not isinstance(errors, list):
            return ()
        return tuple((shown(e.get("code", ""), 60), shown(e.get("message", ""), 200))
                     for e in errors[:10] if isinstance(e, dict))


class FileBody:
    """A blob file sent as a request body in 1 MiB pieces (never read whole), its length known up front;
    `digest` is the sha256 of what was sent once all of it was (None before)."""

    def __init__(self, path: Path, size: int, sent: Callable[[int], None]):
        self.path, self.size, self.sent = path, size, sent
        self.digest: Optional[Digest] = None

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
        self.digest = Digest.of_hash(h) if n == self.size else None


class _Hashed:
    """A blob's byte stream, hashed as it is read."""

    def __init__(self, raw):
        self.raw, self.h = raw, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else None, decode_content=False)
        self.h.update(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def digest(self) -> Digest:
        return Digest.of_hash(self.h)


T = TypeVar("T")


class RegistryClient:
    """One repository of one registry, for one push attempt or one pre-flight question."""

    def __init__(self, address: str, repo: str, stall_s: float, mount_from: Iterable[str] = (),
                 scheme: Optional[str] = None, env: Optional[Mapping[str, str]] = None):
        self.host = address.split("/")[0]
        self.repo, self.stall_s, self.env = repo, stall_s, env
        self.mount_from = [r for r in mount_from if r != repo]
        found = scheme or (probe_scheme(self.host) if is_local(self.host) else "https")
        self.base = f"{'https' if found == 'https' else 'http'}://{self.host}"
        self.origin = (urlsplit(self.base).scheme, self.host)
        self.session = watched_session()
        self.session.max_redirects = MAX_REDIRECTS
        # passed with each request: a Session's own verify loses to REQUESTS_CA_BUNDLE in the environment
        self.verify, self.cert = tls_settings(self.host)
        # like the engine (Go's ProxyFromEnvironment), never through an HTTP(S)_PROXY to a loopback registry
        self.proxies = {"http": None, "https": None, "all": None} if is_local(self.host) else None
        self._authorization: Optional[str] = None  # sent to self.origin only

    def close(self) -> None:
        self.session.close()

    # -- requests ---------------------------------------------------------------------------------
    def _url(self, url: str, what: str) -> str:
        url = urljoin(self.base + "/", url)
        if urlsplit(url).scheme not in ("http", "https"):
            raise RegistryError(f"{what}: {self.host} pointed at a {shown(urlsplit(url).scheme, 20)!r} URL; only http "
                                "and https are followed")
        return url

    def _ours(self, url: str) -> bool:
        parts = urlsplit(url)
        return (parts.scheme, parts.netloc) == self.origin

    def _request(self, method: str, url: str, what: str, body: Optional[Callable[[], object]] = None,
                 replayable: bool = True, headers: Optional[dict] = None, **kw) -> Answer:
        """One request; a 401 from the registry is answered (its challenge) and the request sent again,
        once. A body that cannot be sent twice (a stream) is not: the push's retry sends it again."""
        url = self._url(url, what)
        for round_ in (1, 2):
            sent_headers = dict(headers or {})
            if self._authorization and self._ours(url):
                sent_headers["Authorization"] = self._authorization
            answer = self._send(method, url, what, body, sent_headers, **kw)
            if answer.status_code == 401 and not self._ours(answer.url or url):
                # a redirect led elsewhere, and that host asks for a login: the registry's is not its
                raise RegistryError(f"{what}: {self.host} redirected to {shown(urlsplit(answer.url).netloc, 120)}, "
                                    f"which asked for a login; the login for {self.host} is sent to {self.host} "
                                    "(and the token service it names) only")
            if answer.status_code == 401 and round_ == 1:
                self._authenticate(answer)
                if not replayable:
                    raise TransientRegistryError(f"{what}: {self.host} asked for a login in the middle of an upload; "
                                                 "sending it again with the new one")
                continue
            return answer
        return answer

    def _send(self, method: str, url: str, what: str, body, headers: dict, **kw) -> Answer:
        with answer_within(self.stall_s) as watch:
            try:
                answer = self._exchange(method, url, what, body, headers, **kw)
            except RegistryError:
                if watch.fired:
                    raise self._slow(what) from None
                raise
        if watch.fired:
            raise self._slow(what)
        return answer

    def _exchange(self, method: str, url: str, what: str, body, headers: dict,
                  consume: Optional[Callable[[BinaryIO], object]] = None, **kw) -> Answer:
        """One request and its answer; with CONSUME, a 200 answer's body is not read into it but given to
        CONSUME as a stream, hashed as it is read: Answer.consumed is (what CONSUME returned, the body's
        digest, every byte read)."""
        consumed = None
        try:
            with warnings.catch_warnings():  # an unverified loopback registry, as the engine allows
                warnings.simplefilter("ignore")
                r = self.session.request(method, url, data=body() if body else None, headers=headers,
                                         verify=self.verify, cert=self.cert, proxies=self.proxies,
                                         timeout=(CONNECT_S, self.stall_s), stream=True,
                                         allow_redirects=method in ("GET", "HEAD"), **kw)
                try:
                    if consume is not None and r.status_code == 200:
                        stream = _Hashed(r.raw)
                        out = consume(stream)
                        stream.drain()
                        data, consumed = b"", (out, stream.digest())
                    else:
                        data = r.raw.read(MAX_ANSWER + 1, decode_content=True) if method != "HEAD" else b""
                finally:
                    r.close()
        except requests.exceptions.SSLError as e:
            raise RegistryError(f"{what}: TLS with {self.host} failed ({_reason(e)}); put the registry's CA "
                                f"certificate at {CERTS_D / self.host / 'ca.crt'}") from None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectTimeout):
            raise self._stalled(what) from None
        except requests.exceptions.TooManyRedirects:
            raise RegistryError(f"{what}: {self.host} redirected more than {MAX_REDIRECTS} times") from None
        except (requests.exceptions.InvalidSchema, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidURL) as e:
            raise RegistryError(f"{what}: {self.host} redirected to a URL that is not http or https "
                                f"({type(e).__name__})") from None
        except requests.exceptions.ConnectionError as e:
            reason = _reason(e)
            if "timed out" in reason.lower():
                raise self._stalled(what) from None
            if _refused(reason) or not ping(self.host, timeout=2):  # it went away mid-transfer
                raise RegistryGone(f"{what}: {reason} — the registry {self.host} is not reachable; start it "
                                   f"(`{hint.cmd('registry.start')}`) or fix registry.address") from None
            raise TransientRegistryError(f"{what}: {reason}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:  # a broken answer (bad chunking, decoding)
            raise TransientRegistryError(f"{what}: {self.host} sent a broken answer ({type(e).__name__})") from None
        except OSError as e:  # a body file gone, or a socket error below requests
            raise TransientRegistryError(f"{what}: {type(e).__name__}: {shown(e, 120)}") from None
        return Answer(r.status_code, shown(r.reason or "", 60), r.headers, data[:MAX_ANSWER], r.url,
                      truncated=len(data) > MAX_ANSWER, consumed=consumed)

    def _slow(self, what: str, host: Optional[str] = None) -> Stalled:
        return Stalled(f"{what}: {host or 'the registry ' + self.host} did not finish its answer within "
                       f"{self.stall_s:.0f}s of the request (it trickled or stalled); registry.stall_timeout_s sets "
                       "how long to wait")

    def _stalled(self, what: str) -> Stalled:
        return Stalled(f"{what}: the registry {self.host} made no push progress for {self.stall_s:.0f}s (a stalled "
                       "registry or network); registry.stall_timeout_s sets how long to wait")

    def fail(self, r: Answer, what: str) -> RegistryError:
        """The typed error of an unexpected answer, naming the registry, the status and its error codes."""
        codes = r.error_codes()
        detail = "; ".join(f"{c}: {m}".strip(": ") for c, m in codes)
        msg = f"{what}: the registry {self.host} answered HTTP {r.status_code} {r.reason}".rstrip()
        msg += f" ({detail})" if detail else ""
        kind = kind_of(r.status_code, tuple(c for c, _ in codes))
        if kind is Unauthorized:
            who = "with no login" if self._login() is None else "with the login in the Docker config"
            msg += f", {who} — the registry refused the credentials; run `docker login {self.host}` or fix registry.address"
        return kind(msg, r.status_code, tuple(c for c, _ in codes))

    def _login(self) -> Optional[tuple[str, str]]:
        """The Docker config's login for this registry; a credential helper has the stall bound to answer."""
        return auth.credentials(self.host, self.env, min(self.stall_s, auth.HELPER_TIMEOUT_S))

    def _authenticate(self, r: Answer) -> None:
        """Answer a 401 challenge (Basic or Bearer); without usable credentials, the auth error with the fix."""
        try:
            kind, params = auth.parse_challenge(r.headers.get("WWW-Authenticate", ""))
        except ValueError as e:
            raise RegistryError(f"{self.host} asked for a login with a challenge that cannot be read ({shown(e, 120)}); "
                                "check the registry's auth settings", r.status_code) from None
        creds = self._login()
        if kind == "basic":
            if creds is None:
                raise self.fail(r, f"log in to {self.host}")
            self._authorization = auth.basic(creds)
            return
        if kind != "bearer":
            raise self.fail(r, f"log in to {self.host} (challenge {shown(kind, 20) or 'none'})")
        realm = params.pop("realm", "")
        if urlsplit(realm).scheme not in ("http", "https") or not urlsplit(realm).netloc:
            raise RegistryError(f"{self.host} asked for a Bearer token from {shown(realm, 80)!r}, which is not an "
                                "http or https URL")
        query: dict = {k: v for k, v in params.items() if k in ("service", "scope")}
        query["scope"] = [query["scope"]] if query.get("scope") else [
            f"repository:{self.repo}:pull,push", *(f"repository:{m}:pull" for m in self.mount_from)]
        realm_host = urlsplit(realm).netloc
        verify, cert = tls_settings(realm_host)
        asking = f"getting a token from {realm_host} for {self.host}"
        try:
            with answer_within(self.stall_s) as watch, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = self.session.get(realm, params=query, auth=creds, verify=verify, cert=cert, stream=True,
                                     timeout=(CONNECT_S, self.stall_s), allow_redirects=False)
                try:
                    data = t.raw.read(MAX_ANSWER + 1, decode_content=True)
                finally:
                    t.close()
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            if watch.fired:
                raise self._slow(asking, f"the token service {realm_host}") from None
            raise TransientRegistryError(f"{asking}: {_reason(e)}") from None
        if watch.fired:
            raise self._slow(asking, f"the token service {realm_host}")
        answer = Answer(t.status_code, shown(t.reason or "", 60), t.headers, data[:MAX_ANSWER], realm,
                        truncated=len(data) > MAX_ANSWER)
        if t.status_code != 200:
            raise self.fail(answer, asking)
        try:
            doc = answer.json()
            token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        except ValueError:
            token = None
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN or not _TOKEN_CHARS.fullmatch(token):
            raise RegistryError(f"the token service {realm_host} gave no usable token for {self.host} (a token is "
                                "printable ASCII without spaces, at most 16 KiB)")
        self._authorization = f"Bearer {token}"

    # -- the API --------------------------------------------------------------------------------------
    def check(self) -> None:
        """GET /v2/: the registry answers and takes this login (answering its challenge)."""
        r = self._request("GET", "/v2/", f"reaching {self.host}")
        if r.status_code != 200:
            raise self.fail(r, f"reaching {self.host}")

    def has_manifest(self, reference: str) -> bool:
        """HEAD the manifest (a digest or tag) as a puller asks for it: True when served, False on 404."""
        r = self._request("HEAD", f"/v2/{self.repo}/manifests/{reference}", f"asking for manifest {reference[:19]}",
                          headers={"Accept": ACCEPT_MANIFESTS})
        if r.status_code == 200:
            return True
        if r.status_code == 404:
            return False
        raise self.fail(r, f"asking {self.host} for the manifest {reference[:19]} of {self.repo}")

    def get_manifest(self, reference: str) -> Optional[tuple[bytes, str]]:
        """GET the manifest (a tag or digest): (its bytes, its media type); None on 404. Bytes that do
        not fit MAX_ANSWER, or that are not the digest asked for, are a RegistryError."""
        what = f"reading the manifest {self.repo}:{reference[:72]}"
        r = self._request("GET", f"/v2/{self.repo}/manifests/{reference}", what, headers={"Accept": ACCEPT_MANIFESTS})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(r, what)
        if r.truncated:
            raise RegistryError(f"{what}: {self.host} sent more than {MAX_ANSWER} bytes")
        if reference.startswith("sha256:") and Digest.of(r.body) != reference:
            raise RegistryError(f"{what}: {self.host} sent bytes that are not that digest")
        return r.body, shown(r.headers.get("Content-Type", ""), 120).split(";")[0].strip()

    def get_small_blob(self, digest: str, what: str) -> Optional[bytes]:
        """GET a blob of at most MAX_ANSWER bytes (an image config), checked against its digest; None on 404."""
        digest = Digest(digest, "blob digest")
        what = f"reading {what} ({digest.short}) from {self.repo}"
        r = self._request("GET", f"/v2/{self.repo}/blobs/{digest}", what)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(r, what)
        if r.truncated or Digest.of(r.body) != digest:
            raise RegistryError(f"{what}: {self.host} sent bytes that are not that blob"
                                + (f" (more than {MAX_ANSWER})" if r.truncated else ""))
        return r.body

    def read_blob(self, digest: str, what: str, consume: Callable[[BinaryIO], T]) -> Optional[T]:
        """GET a blob of any size (a base image's layer) as a stream CONSUME reads; what it returns, once
        every byte of the blob has been read and found to be DIGEST's (what CONSUME left is read too);
        None on 404. Each read waits at most the stall timeout; a redirect (to the registry's storage)
        is followed without the login, as for any other answer."""
        digest = Digest(digest, "blob digest")
        what = f"reading {what} ({digest.short}) from {self.repo}"
        url = f"/v2/{self.repo}/blobs/{digest}"
        if self._request("HEAD", url, what).status_code == 404:  # answers a login challenge first
            return None
        headers = {"Authorization": self._authorization} if self._authorization else {}
        # not through _send: its watch on the whole answer would cut a big layer off; each read has the stall timeout
        r = self._exchange("GET", self._url(url, what), what, None, headers, consume=consume)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(r, what)
        out, got = r.consumed
        if got != digest:
            raise RegistryError(f"{what}: {self.host} sent bytes that are not that blob (they hash to {got.short})")
        return out

    def has_blob(self, digest: str) -> bool:
        return self.blob_size(digest) is not None

    def blob_size(self, digest: str, repo: Optional[str] = None) -> Optional[int]:
        """HEAD the blob in REPO (default this one): its size (-1 when the registry gives none: no
        Content-Length, or 0, which no blob is and some proxies send for a HEAD), None on 404."""
        repo, digest = repo or self.repo, Digest(digest, "blob digest")
        r = self._request("HEAD", f"/v2/{repo}/blobs/{digest}", f"asking {repo} for blob {digest.short}")
        if r.status_code == 200:
            length = r.headers.get("Content-Length", "")
            size = int(length) if length.isascii() and length.isdigit() and len(length) < 16 else -1
            return size if size > 0 else -1
        if r.status_code == 404:
            return None
        raise self.fail(r, f"asking {repo} for blob {digest.short}")

    def mount(self, digest: str, other: str) -> bool:
        """Mount a blob from another repository of this registry (no bytes sent): True when it was.
        Asked only where that repository has it (`blob_size(digest, other)`), so no upload session is
        left open otherwise."""
        if other == self.repo:
            return False
        digest = Digest(digest, "blob digest")
        r = self._request("POST", f"/v2/{self.repo}/blobs/uploads/", f"mounting blob {digest.short} from {other}",
                          params={"mount": digest, "from": other})
        if r.status_code == 201:
            return True
        if r.status_code == 202 and r.headers.get("Location"):  # not mounted: drop the upload session it opened
            self.cancel_upload(self._url(r.headers["Location"], "cancelling an upload"))
            return False
        raise self.fail(r, f"mounting blob {digest.short} from {other}")

    def _start_upload(self, what: str) -> str:
        """POST an upload session; its Location (relative or absolute, its query kept)."""
        r = self._request("POST", f"/v2/{self.repo}/blobs/uploads/", f"starting the upload of {what}")
        if r.status_code != 202 or not r.headers.get("Location"):
            raise self.fail(r, f"starting the upload of {what}")
        return self._url(r.headers["Location"], f"starting the upload of {what}")

    def upload(self, digest: str, body: Callable[[], object], size: int, what: str) -> None:
        """An upload session, then one PUT of the whole blob at its Location with ?digest=."""
        r = self._request("PUT", self._start_upload(what), f"uploading {what}", body=body, params={"digest": digest},
                          headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if r.status_code != 201:
            raise self.fail(r, f"uploading {what}")

    def upload_stream(self, chunks: Iterable[bytes], what: str) -> str:
        """An upload session PATCHed the blob as it is made (chunked: its size and digest are not known
        yet); the session's Location for `finish_upload`. The engine's own push uploads so."""
        r = self._request("PATCH", self._start_upload(what), f"uploading {what}", body=lambda: chunks,
                          replayable=False, headers={"Content-Type": "application/octet-stream"})
        if r.status_code != 202 or not r.headers.get("Location"):
            raise self.fail(r, f"uploading {what}")
        return self._url(r.headers["Location"], f"uploading {what}")

    def finish_upload(self, location: str, digest: str, what: str) -> None:
        """Close a streamed upload: the registry checks the bytes it got against DIGEST."""
        r = self._request("PUT", location, f"finishing the upload of {what}", params={"digest": digest},
                          headers={"Content-Length": "0"})
        if r.status_code != 201:
            raise self.fail(r, f"finishing the upload of {what}")

    def cancel_upload(self, location: str) -> None:
        """Drop an upload session whose bytes are not to be kept (best effort: the registry expires it anyway)."""
        try:
            self._request("DELETE", location, "cancelling an upload")
        except RegistryError:
            pass

    def put_manifest(self, tag: str, manifest_bytes: bytes) -> Digest:
        """PUT the manifest under tag; its digest (sha256 of these bytes), checked against the registry's."""
        digest = Digest.of(manifest_bytes)
        r = self._request("PUT", f"/v2/{self.repo}/manifests/{tag}", f"putting the manifest of {self.repo}:{tag}",
                          body=lambda: manifest_bytes, headers={"Content-Type": MANIFEST_V2})
        if r.status_code != 201:
            raise self.fail(r, f"putting the manifest of {self.repo}:{tag}")
        said = r.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise RegistryError(f"{self.host} stored the manifest of {self.repo}:{tag} as {shown(said, 80)}, not as "
                                f"the sha256 of the bytes sent ({digest}); the registry rewrote it")
        return digest


def manifest(config: bytes, layers: list[tuple[str, int]]) -> bytes:
    """A Docker schema2 manifest: the config blob and the gzip layers (digest, size), in order."""
    config_digest = Digest.of(config)
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_V2,
           "config": {"mediaType": CONFIG_V1, "size": len(config), "digest": config_digest},
           "layers": [{"mediaType": LAYER_GZIP, "size": size, "digest": digest} for digest, size in layers]}
    return json.dumps(doc, indent=3).encode()


def _refused(reason: str) -> bool:
    return bool(re.search(r"connection refused|no such host|name or service not known|"
                          r"temporary failure in name resolution|errno -[235]\b", reason, re.I))


def _reason(e: BaseException) -> str:
    """The innermost useful words of a requests/urllib3 error (no URL with a query, no credentials)."""
    text = str(e)
    inner = re.findall(r"\[Errno -?\d+\] [^'\")]+|Connection refused|Connection reset by peer|Broken pipe|"
                       r"Remote end closed connection without response|timed out|"
                       r"certificate verify failed[^'\")]*|EOF occurred[^'\")]*", text)
    return shown(inner[-1] if inner else type(e).__name__, 160)

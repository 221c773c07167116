"""The registry package (deploy/registry/): one client for the push and the pre-flight.

Against real registries: Debian's docker-registry with token auth (`auth: token`, an issuer of our
own on another port, as Harbor, GitLab and Docker Hub run it) and with TLS and htpasswd. Against
hostile stand-ins: where the login and the token may go (only the registry's own origin, and the
login to the realm its challenge names), which URLs are followed, and how much of an answer is read.
The challenge parser has property tests."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings, strategies as st

from deploy.registry import auth, check
from deploy.registry.client import MAX_ANSWER, RegistryClient, manifest
from deploy.registry.errors import NotFound, RegistryError, TransientRegistryError, Unauthorized, kind_of
from runtime.imageref import ImageRef

MISSING = "sha256:" + "0" * 64


PASSWORD = "s3cret-token-login"


@pytest.fixture
def token_registry(tmp_path):
    """The tests' token-auth registry (tests/helpers/token_auth.py): docker-registry with `auth: token` and a
    token service on another port that takes the login `trainer` / PASSWORD."""
    from helpers.token_auth import TokenRegistry, TokenService
    service = TokenService(tmp_path, "trainer", PASSWORD)
    reg = TokenRegistry(tmp_path / "token-registry", service)
    yield reg
    reg.stop()
    service.close()


def _env(tmp_path, config_dir=None) -> dict:
    return {"DOCKER_CONFIG": str(config_dir or tmp_path / "no-login"), "HOME": str(tmp_path)}


def _push_one(client: RegistryClient, tag: str = "v1") -> str:
    """A one-blob image through the client's own calls; its manifest digest."""
    layer = b"not really a tar, but a blob\n"
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": []}}).encode()
    for blob in (layer, config):
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        if not client.has_blob(digest):
            client.upload(digest, lambda b=blob: b, len(blob), f"blob {digest[7:19]}")
    return client.put_manifest(tag, manifest(config, [("sha256:" + hashlib.sha256(layer).hexdigest(), len(layer))]))


# -- token auth, against the real registry ---------------------------------------------------------

def test_token_auth_push_and_preflight(token_registry, tmp_path):
    reg = token_registry
    logged_in = _login_env(tmp_path, reg.address, password=PASSWORD)
    client = RegistryClient(reg.address, "team/model", stall_s=10, env=logged_in)
    try:
        digest = _push_one(client)
    finally:
        client.close()
    # the login went to the realm (another port: the service records only what it took a login for), with the
    # scope the push needs, which the registry's challenge names with a comma in it
    assert any("push" in scope and scope.startswith("repository:team/model:")
               for scopes in reg.service.scopes for scope in scopes), reg.service.scopes

    ref = ImageRef.parse(f"{reg.address}/team/model@{digest}")
    assert check.check(ref, "http", logged_in) is None
    unknown = check.check(ImageRef.parse(f"{reg.address}/team/model@{MISSING}"), "http", logged_in)
    assert f"has no manifest {MISSING} in team/model" in unknown
    anonymous = check.check(ref, "http", _env(tmp_path))
    assert "answered 401 without credentials" in anonymous and f"docker login {reg.address}" in anonymous
    wrong = check.check(ref, "http", _login_env(tmp_path / "w", reg.address, password="guess"))
    assert "answered 401 with the credentials of `docker login" in wrong


def test_token_auth_refused_login_is_typed_and_names_the_fix(token_registry, tmp_path):
    reg = token_registry
    client = RegistryClient(reg.address, "team/model", stall_s=10,
                            env=_login_env(tmp_path, reg.address, password="guess"))
    with pytest.raises(Unauthorized, match=f"refused the credentials; run `docker login {reg.address}`") as e:
        client.check()
    assert e.value.status == 401
    assert "guess" not in str(e.value)  # never the password in a message


def test_tls_and_htpasswd_preflight(private_registry, trusted_ca, tmp_path):
    private = private_registry
    ref = ImageRef.parse(f"{private.address}/tiny@{MISSING}")
    anonymous = check.check(ref, "https", _env(tmp_path))
    assert "answered 401 without credentials" in anonymous and "http1.1" in anonymous  # enroot's HTTP/2 note
    login = private.login(tmp_path / "login")
    assert login.returncode == 0, login.stderr
    unknown = check.check(ref, "https", _env(tmp_path, tmp_path / "login"))
    assert f"has no manifest {MISSING} in tiny (manifest unknown)" in unknown


def test_a_registry_that_is_down_is_named(tmp_path):
    down = check.check(ImageRef.parse(f"127.0.0.1:1/raytrain-cpu@{MISSING}"), "https", _env(tmp_path), timeout_s=3)
    assert "registry 127.0.0.1:1 is unreachable from here" in down and "deploy without --submit" in down


# -- the credential rule, against hostile stand-ins --------------------------------------------------

class Server:
    """A tiny HTTP server: `answer(handler)` decides each response; every request's method, path and
    Authorization header is recorded."""

    def __init__(self, answer):
        self.seen: list[tuple[str, str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                status, headers, body = answer(self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def servers():
    made = []

    def make(answer):
        s = Server(answer)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def _login_env(tmp_path, host: str, user="trainer", password="s3cret") -> dict:
    d = tmp_path / "cfg"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"auths": {host: {"auth": base64.b64encode(
        f"{user}:{password}".encode()).decode()}}}))
    return _env(tmp_path, d)


def _basic_registry(location_for):
    """A registry stand-in that wants Basic and answers an upload POST with Location location_for()."""
    def answer(h):
        if not h.headers.get("Authorization"):
            return 401, {"WWW-Authenticate": 'Basic realm="x"'}, b""
        if h.command == "POST":
            return 202, {"Location": location_for()}, b""
        return 201, {}, b""
    return answer


@pytest.mark.parametrize("where", ["another port", "another host name", "user info", "plain http of another port"])
def test_an_upload_location_elsewhere_gets_no_login(servers, tmp_path, where):
    bystander = servers(lambda h: (201, {}, b""))
    port = bystander.address.split(":")[1]
    location = {"another port": f"http://{bystander.address}/upload",
                "another host name": f"http://localhost:{port}/upload",
                "user info": f"http://x@{bystander.address}/upload",
                "plain http of another port": f"http://127.0.0.1:{port}/upload?x=1"}[where]
    reg = servers(_basic_registry(lambda: location))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    client.upload("sha256:" + "1" * 64, lambda: b"data", 4, "a blob")
    assert reg.seen[-1][2].startswith("Basic ")  # the registry itself got the login
    assert bystander.seen and all(auth_ == "" for _, _, auth_ in bystander.seen), bystander.seen


def test_a_location_on_the_registry_itself_keeps_the_login(servers, tmp_path):
    reg = servers(_basic_registry(lambda: f"http://{reg.address}/v2/repo/blobs/uploads/abc"))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    client.upload("sha256:" + "1" * 64, lambda: b"data", 4, "a blob")
    put = [s for s in reg.seen if s[0] == "PUT"]
    assert put and put[-1][2].startswith("Basic ")


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:alert(1)"])
def test_only_http_and_https_are_followed(servers, tmp_path, target):
    reg = servers(_basic_registry(lambda: target))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    with pytest.raises(RegistryError, match="only http and https are followed"):
        client.upload("sha256:" + "1" * 64, lambda: b"data", 4, "a blob")


def test_a_redirect_loop_and_a_redirect_to_a_file_url_are_one_error(servers, tmp_path):
    loop = servers(lambda h: (302, {"Location": h.path}, b""))
    client = RegistryClient(loop.address, "repo", stall_s=5, scheme="http", env=_env(tmp_path))
    with pytest.raises(RegistryError, match="redirected more than 5 times"):
        client.check()
    to_file = servers(lambda h: (302, {"Location": "file:///etc/passwd"}, b""))
    client = RegistryClient(to_file.address, "repo", stall_s=5, scheme="http", env=_env(tmp_path))
    with pytest.raises(RegistryError, match="not http or https"):
        client.check()


def test_a_redirect_to_another_host_drops_the_login(servers, tmp_path):
    bystander = servers(lambda h: (200, {}, b"{}"))

    def answer(h):
        if not h.headers.get("Authorization"):
            return 401, {"WWW-Authenticate": 'Basic realm="x"'}, b""
        return 307, {"Location": f"http://{bystander.address}/v2/"}, b""
    reg = servers(answer)
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    client.check()
    assert bystander.seen and bystander.seen[-1][2] == ""


def test_a_401_from_the_host_a_redirect_led_to_gets_no_login(servers, tmp_path):
    """The registry redirects; the host it names answers 401 with a Basic challenge and with a Bearer one whose
    realm is its own: neither gets the registry's login (it is judged by the answer's own URL, not the
    request's), and the refusal names the other host."""
    for challenge in ('Basic realm="other"', None):
        realm_seen = []
        realm = servers(lambda h: (realm_seen.append(h.headers.get("Authorization") or ""),
                                   (200, {"Content-Type": "application/json"}, b'{"token": "t"}'))[1])
        other = servers(lambda h, c=challenge: (401, {"WWW-Authenticate": c or
                                                      f'Bearer realm="http://{realm.address}/token",service="x"'}, b""))
        reg = servers(lambda h: (307, {"Location": f"http://{other.address}/v2/"}, b""))
        client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
        with pytest.raises(RegistryError, match=re.escape(other.address)):
            client.check()
        assert all(a == "" for _, _, a in other.seen), other.seen
        assert realm_seen == [], realm_seen


def test_a_token_realm_that_is_not_http_is_refused_and_a_bad_token_is_not_sent(servers, tmp_path):
    reg = servers(lambda h: (401, {"WWW-Authenticate": 'Bearer realm="file:///etc/passwd",service="x"'}, b""))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    with pytest.raises(RegistryError, match="not an http or https URL"):
        client.check()
    issuer = servers(lambda h: (200, {"Content-Type": "application/json"}, b'{"token": "abc\\r\\nX-Evil: 1"}'))
    reg2 = servers(lambda h: (401, {"WWW-Authenticate": f'Bearer realm="http://{issuer.address}/t",service="x"'}, b""))
    client = RegistryClient(reg2.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg2.address))
    with pytest.raises(RegistryError, match="no usable token"):
        client.check()
    assert all("X-Evil" not in a for _, _, a in reg2.seen)


def test_an_error_body_is_read_up_to_the_bound_and_shown_without_escapes(servers, tmp_path):
    huge = b'{"errors": [{"code": "DENIED", "message": "\x1b[31mno\x1b[0m"}]}' + b" " * (3 * MAX_ANSWER)
    reg = servers(lambda h: (403, {"Content-Type": "application/json"}, huge))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_env(tmp_path))
    with pytest.raises(RegistryError) as e:
        client.check()
    assert "\x1b" not in str(e.value) and e.value.status == 403  # cut at the bound: no JSON, typed by status
    small = servers(lambda h: (403, {}, b'{"errors": [{"code": "DENIED", "message": "\\u001b[31mno\\u001b[0m"}]}'))
    client = RegistryClient(small.address, "repo", stall_s=5, scheme="http", env=_env(tmp_path))
    with pytest.raises(Unauthorized) as e:
        client.check()
    assert e.value.codes == ("DENIED",) and "\x1b" not in str(e.value)


def test_a_401_in_the_middle_of_a_streamed_upload_is_retried_not_resent_empty(servers, tmp_path):
    def answer(h):
        if h.command == "PATCH" and not h.headers.get("Authorization"):
            return 401, {"WWW-Authenticate": 'Basic realm="x"'}, b""
        if h.command == "POST":
            return 202, {"Location": "/v2/repo/blobs/uploads/1"}, b""
        return 202, {"Location": "/v2/repo/blobs/uploads/1"}, b""
    reg = servers(answer)
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    with pytest.raises(TransientRegistryError, match="asked for a login in the middle of an upload"):
        client.upload_stream(iter([b"abc"]), "a layer")
    assert [s[0] for s in reg.seen].count("PATCH") == 1


# -- errors typed by status and code ---------------------------------------------------------------

@pytest.mark.parametrize("status,codes,kind", [
    (401, (), Unauthorized), (403, ("DENIED",), Unauthorized), (400, ("UNAUTHORIZED",), Unauthorized),
    (404, ("MANIFEST_UNKNOWN",), NotFound), (400, ("BLOB_UNKNOWN",), NotFound), (503, (), TransientRegistryError),
    (429, ("TOOMANYREQUESTS",), TransientRegistryError), (400, ("BLOB_UPLOAD_INVALID",), TransientRegistryError),
    (400, ("DIGEST_INVALID",), RegistryError)])
def test_errors_are_typed_by_status_and_code(status, codes, kind):
    assert kind_of(status, codes) is kind


# -- the challenge parser --------------------------------------------------------------------------

def test_challenges_as_registries_send_them():
    assert auth.parse_challenge('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
                                'scope="repository:samalba/my-app:pull,push"') == (
        "bearer", {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                   "scope": "repository:samalba/my-app:pull,push"})
    assert auth.parse_challenge('Basic realm="Registry Realm"') == ("basic", {"realm": "Registry Realm"})
    # an escaped quote, spaces around '=', a bare token value (a repeated name: refused, below)
    assert auth.parse_challenge('Bearer realm = "a\\"b" , error=insufficient_scope') == (
        "bearer", {"realm": 'a"b', "error": "insufficient_scope"})
    assert auth.parse_challenge("") == ("", {})
    # a part without '=', and text after a value, are refused saying so
    with pytest.raises(ValueError, match="not name=value: 'garbage'"):
        auth.parse_challenge('Bearer garbage, realm="x"')
    with pytest.raises(ValueError, match="text after the value of 'realm'"):
        auth.parse_challenge('Bearer realm="x" y')


_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_names, _values, max_size=6))
def test_any_quoted_parameters_come_back_as_sent(params):
    quoted = ",".join(f'{k}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for k, v in params.items())
    assert auth.parse_challenge(f"Bearer {quoted}") == ("bearer", params)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_header_is_read_or_refused_saying_why(header):
    try:
        kind, params = auth.parse_challenge(header)
    except ValueError as e:
        assert "name=value" in str(e) or "text after the value" in str(e)
        return
    assert isinstance(kind, str) and all(isinstance(v, str) for v in params.values())


def test_a_challenge_with_a_stray_part_is_one_error_naming_the_registry(servers, tmp_path):
    reg = servers(lambda h: (401, {"WWW-Authenticate": 'Bearer garbage, realm="http://x/t"'}, b""))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_env(tmp_path))
    with pytest.raises(RegistryError, match=f"{reg.address} asked for a login with a challenge that cannot be read"):
        client.check()


@pytest.mark.parametrize("header", ['Bearer realm="http://other/t",service="x",realm="http://reg/t"',
                                    'Basic realm="a", REALM="b"'])
def test_a_challenge_that_names_a_parameter_twice_is_refused(header, servers, tmp_path):
    """RFC 7235: a parameter occurs once per challenge. With two realms, either choice sends the login to a
    realm the registry may not mean; none is made."""
    with pytest.raises(ValueError, match="realm.* twice"):
        auth.parse_challenge(header)
    reg = servers(lambda h: (401, {"WWW-Authenticate": header}, b""))
    client = RegistryClient(reg.address, "repo", stall_s=5, scheme="http", env=_login_env(tmp_path, reg.address))
    with pytest.raises(RegistryError, match=f"{reg.address} asked for a login with a challenge that cannot be read"):
        client.check()
    assert all(a == "" for _, _, a in reg.seen)


# -- answers that trickle: the whole answer within the stall timeout --------------------------------

class Trickle:
    """A raw stand-in that reads a request, then sends its answer a piece at a time, 0.2 s apart, for up
    to 60 s: MODE "headers" (header lines that never end) or "body" (a 100 kB body a byte at a time).
    PATH_OK: requests whose path starts with it get a normal 401 Bearer challenge pointing at REALM."""

    def __init__(self, mode: str, challenge: str = ""):
        import socket
        self.mode, self.challenge = mode, challenge
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        import time
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096) or b"\r\n\r\n"
            if self.challenge and data.startswith(b"GET /v2/ "):
                conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nWWW-Authenticate: "
                             + self.challenge.encode() + b"\r\n\r\n")
                return self._answer(conn)
            if self.mode == "headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                pieces = (f"X-Slow-{i}: y\r\n".encode() for i in range(300))
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                pieces = (b" " for _ in range(300))
            for piece in pieces:
                if self.stop.is_set():
                    break
                conn.sendall(piece)
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_a_registry_that_trickles_its_answer_is_cut_off_at_the_stall_timeout(tmp_path, mode):
    import time
    from deploy.registry.errors import Stalled
    slow = Trickle(mode)
    try:
        client = RegistryClient(slow.address, "repo", stall_s=1.5, scheme="http", env=_env(tmp_path))
        t0 = time.monotonic()
        with pytest.raises(Stalled, match=r"did not finish its answer within 2s"):
            client.check()
        assert time.monotonic() - t0 < 10  # the stand-in trickles for 60 s
        if mode == "body":
            return  # the pre-flight asks with HEAD: no body is read
        t0 = time.monotonic()
        said = check.check(ImageRef.parse(f"{slow.address}/repo@{MISSING}"), "http", _env(tmp_path), timeout_s=1.5)
        assert time.monotonic() - t0 < 10 and "did not finish its answer" in (said or "")
    finally:
        slow.close()


def test_a_token_service_that_trickles_is_cut_off_and_named(tmp_path):
    import time
    from deploy.registry.errors import Stalled
    issuer = Trickle("body")
    reg = Trickle("body", challenge=f'Bearer realm="http://{issuer.address}/token",service="x"')
    try:
        client = RegistryClient(reg.address, "repo", stall_s=1.5, scheme="http", env=_login_env(tmp_path, reg.address))
        t0 = time.monotonic()
        with pytest.raises(Stalled, match=rf"the token service {issuer.address} did not finish its answer"):
            client.check()
        assert time.monotonic() - t0 < 10
    finally:
        issuer.close()
        reg.close()


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_the_scheme_probe_is_bounded_by_its_timeout(mode):
    """The probe a push records the scheme with (and ping) ends within its timeout whatever the registry
    sends: header lines that never end are cut at the deadline; a body that trickles is never read."""
    import time
    from deploy.registry.address import ping, scheme
    slow = Trickle(mode)
    try:
        t0 = time.monotonic()
        said = scheme(slow.address, timeout=1.0)
        assert time.monotonic() - t0 < 6, mode  # the stand-in trickles for 60 s; TLS, plain HTTP, TLS again
        assert said == ("unknown" if mode == "headers" else "http")
        t0 = time.monotonic()
        assert ping(slow.address, timeout=1.0) is (mode == "body")
        assert time.monotonic() - t0 < 4
    finally:
        slow.close()

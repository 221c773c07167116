"""A registry with token auth, as Harbor, GitLab, GHCR and Docker Hub run one: Debian's docker-registry
with `auth: token`, and a small token issuer of our own on another port (its realm). The issuer
takes a Basic login and signs a JWT (ES256, its certificate in the `x5c` header and in the
registry's rootcertbundle) granting pull and push on the scopes asked for. It records every request
it got, so a test can see where the login went."""
from __future__ import annotations

import base64
import datetime
import json
import secrets
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jwt
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVICE, ISSUER = "raytrain-test-registry", "raytrain-test-issuer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TokenRegistry:
    def __init__(self, workdir: Path, user: str = "trainer"):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.user, self.password = user, secrets.token_urlsafe(16)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.issuer_requests: list[dict] = []  # path, query and Authorization of each request the issuer got
        self.proc: subprocess.Popen | None = None
        self.issuer: ThreadingHTTPServer | None = None

    def _certificate(self) -> bytes:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert_der = cert.public_bytes(serialization.Encoding.DER)
        return cert.public_bytes(serialization.Encoding.PEM)

    def token(self, scopes: list[str], subject: str) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name:
                access.append({"type": "repository", "name": name, "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(8), "access": access}
        return jwt.encode(claims, self.key, algorithm="ES256",
                          headers={"x5c": [base64.b64encode(self.cert_der).decode()]})

    def _start_issuer(self) -> str:
        reg = self

        class Issuer(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                said = self.headers.get("Authorization", "")
                reg.issuer_requests.append({"path": parts.path, "query": query, "authorization": said})
                expected = "Basic " + base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
                if said != expected:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": reg.token(query.get("scope", []), reg.user), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.issuer = ThreadingHTTPServer(("127.0.0.1", 0), Issuer)
        threading.Thread(target=self.issuer.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.issuer.server_address[1]}/token"

    def start(self) -> "TokenRegistry":
        d = self.dir
        (d / "issuer.pem").write_bytes(self._certificate())
        self.realm = self._start_issuer()
        (d / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {d / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n"
            f"auth:\n  token:\n    realm: {self.realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n"
            f"    rootcertbundle: {d / 'issuer.pem'}\n")
        binary = shutil.which("docker-registry") or shutil.which("registry")
        self.proc = subprocess.Popen([binary, "serve", str(d / "config.yml")], stdout=subprocess.DEVNULL,
                                     stderr=open(d / "registry.log", "wb"))
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://{self.address}/v2/", timeout=2).status_code == 401:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"token registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def docker_config(self, config_dir: Path, password: str | None = None) -> Path:
        """A Docker config holding this registry's login (as `docker login` writes it)."""
        config_dir.mkdir(parents=True, exist_ok=True)
        login = base64.b64encode(f"{self.user}:{self.password if password is None else password}".encode()).decode()
        (config_dir / "config.json").write_text(json.dumps({"auths": {self.address: {"auth": login}}}))
        return config_dir

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        if self.issuer:
            self.issuer.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)

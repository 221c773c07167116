"""A registry that asks for Bearer tokens, as Docker Hub, Harbor or GitLab do: Debian's docker-registry
with `auth: token` and a small token service here that checks a user's password (Basic) and signs an
RS256 JWT granting the scopes asked for (its certificate is the registry's root bundle)."""
from __future__ import annotations

import base64
import datetime
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from helpers.small_image import PlainRegistry

SERVICE, ISSUER = "raytrain-test", "raytrain-test-issuer"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    def __init__(self, workdir: Path, user: str, password: str):
        self.user, self.password = user, password
        self.scopes: list[list[str]] = []  # the scopes of each token asked for
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raytrain test token signer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.bundle = workdir / "token-signer.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                query = parse_qs(urlsplit(self.path).query)
                given = self.headers.get("Authorization", "")
                want = "Basic " + base64.b64encode(f"{service.user}:{service.password}".encode()).decode()
                if given != want:
                    body = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}).encode()
                    self.send_response(401)
                else:
                    scopes = query.get("scope", [])
                    service.scopes.append(scopes)
                    body = json.dumps({"token": service.token(scopes, query.get("service", [""])[0])}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, scopes: list[str], audience: str) -> str:
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": self.user, "aud": audience, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}".encode()
        return signing_input.decode() + "." + _b64(self.key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256()))

    def close(self) -> None:
        self.server.shutdown()


class TokenRegistry(PlainRegistry):
    """docker-registry on a free loopback port (plain HTTP) that takes only the service's tokens."""

    def __init__(self, workdir: Path, service: TokenService):
        self.service = service
        super().__init__(workdir)

    def auth_config(self) -> str:
        return (f"auth:\n  token:\n    realm: {self.service.realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n"
                f"    rootcertbundle: {self.service.bundle}\n")

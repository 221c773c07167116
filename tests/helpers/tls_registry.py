"""A private registry as sites run one: Debian's docker-registry serving TLS (its own CA, made with
openssl) and asking for a login (htpasswd, bcrypt, the only hash it accepts)."""
from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import bcrypt
import requests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class TlsRegistry:
    def __init__(self, workdir: Path, port: int | None = None, user: str = "trainer"):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.user, self.password = user, secrets.token_urlsafe(16)
        self.ca = self.dir / "ca.crt"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "TlsRegistry":
        d = self.dir
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=raytrain test CA",
                 "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
                 "-out", "server.csr", cwd=d)
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.ext", "-out", "server.crt", cwd=d)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=5)).decode()
        (d / "htpasswd").write_text(f"{self.user}:{hashed}\n")
        (d / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {d / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n  tls:\n    certificate: {d / 'server.crt'}\n    key: {d / 'server.key'}\n"
            f"auth:\n  htpasswd:\n    realm: raytrain-test\n    path: {d / 'htpasswd'}\n")
        binary = shutil.which("docker-registry") or shutil.which("registry")
        self.proc = subprocess.Popen([binary, "serve", str(d / "config.yml")], stdout=subprocess.DEVNULL,
                                     stderr=open(d / "registry.log", "wb"))
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"https://{self.address}/v2/", verify=str(self.ca), timeout=2).status_code == 401:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"TLS registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def login(self, config_dir: Path, password: Optional[str] = None) -> subprocess.CompletedProcess:
        """`docker login` with its own config directory (the machine's own login is left alone)."""
        return subprocess.run(["docker", "--config", str(config_dir), "login", self.address, "-u", self.user,
                               "--password-stdin"], input=self.password if password is None else password,
                              text=True, capture_output=True)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


def tiny_image(client, ref: str, text: bytes = b"raytrain registry test\n") -> str:
    """A one-file image made here (nothing can be pulled), tagged REF; returns its id."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    repository, _, tag = ref.rpartition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    return client.images.get(ref).id

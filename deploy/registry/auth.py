"""Who the registry is told we are: the Docker CLI's login for a host, and the answer to its challenge.

    login      the Docker CLI's config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json):
               credHelpers[host], then auths[host].auth, then credsStore, as the engine's client reads it
    challenge  a 401's WWW-Authenticate header (RFC 7235: a scheme, then comma-separated name=value
               parameters whose values may be quoted strings holding commas and escaped quotes):
               Basic is answered with the login, Bearer with a token from its realm
"""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Mapping, Optional

from deploy.registry.errors import RegistryError
from runtime.files import FileReadError, read_regular

MAX_DOCKER_CONFIG = 4 << 20  # the Docker CLI's config.json: logins and settings, kilobytes in practice
MAX_HELPER_OUTPUT = 1 << 20  # what a credential helper prints: one small JSON object
HELPER_TIMEOUT_S = 60.0      # a credential helper's answer (a cloud login may take seconds); a client's stall bound is lower when set so

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf'\s*({_TOKEN})\s*=\s*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))\s*')
_ESCAPE = re.compile(r"\\(.)")


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """(scheme in lower case, parameters) of a WWW-Authenticate value. ValueError, saying what, for a part
    that is not name=value, text after a value, or a name given twice (names are case-insensitive)."""
    header = header.strip()
    scheme, _, rest = header.partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        if rest[pos] in " \t,":
            pos += 1
            continue
        m = _PARAM.match(rest, pos)
        if not m:
            end = _next_comma(rest, pos)
            raise ValueError(f"a part that is not name=value: {rest[pos:end if end >= 0 else None][:60]!r}")
        name = m.group(1).lower()
        if name in params:  # RFC 7235: once per challenge; two realms leave no right one to send a login to
            raise ValueError(f"it names {name!r} twice")
        params[name] = _ESCAPE.sub(r"\1", m.group(2)) if m.group(2) is not None else m.group(3)
        pos = m.end()
        if pos < len(rest) and rest[pos] != ",":
            raise ValueError(f"text after the value of {m.group(1)!r}: {rest[pos:pos + 60]!r}")
    return scheme.lower(), params


def _next_comma(text: str, pos: int) -> int:
    quoted = False
    i = pos
    while i < len(text):
        c = text[i]
        if c == "\\" and quoted:
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "," and not quoted:
            return i
        i += 1
    return -1


def docker_config(env: Optional[Mapping[str, str]] = None) -> tuple[Path, dict]:
    env = os.environ if env is None else env
    d = env.get("DOCKER_CONFIG")
    home = Path(env.get("HOME") or Path.home())
    path = Path(d) / "config.json" if d else home / ".docker" / "config.json"
    try:
        doc = json.loads(read_regular(path, MAX_DOCKER_CONFIG))
    except FileNotFoundError:
        return path, {}
    except FileReadError as e:
        raise RegistryError(f"{path}: the Docker config {e}; fix it, or remove it and log in again "
                            "(`docker login <registry>`)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise RegistryError(f"{path}: not readable as the Docker config ({type(e).__name__}); fix it, or remove it "
                            "and log in again (`docker login <registry>`)") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{path}: the Docker config is not a JSON object; fix it, or remove it and log in again")
    return path, doc


def _bounded_run(argv: list[str], stdin: bytes, timeout_s: float, limit: int) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of ARGV given STDIN, ended within TIMEOUT_S; a stream is read up to LIMIT + 1
    bytes, and a program that prints more is killed (its output is then longer than LIMIT)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group: what it started goes with it
    got: dict[str, bytes] = {}

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def read(name: str, stream) -> None:
        got[name] = stream.read(limit + 1)
        if len(got[name]) > limit:
            kill()
    readers = [threading.Thread(target=read, args=(n, s), daemon=True) for n, s in (("out", proc.stdout),
                                                                                   ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill()
        proc.wait()
        raise
    for r in readers:
        r.join(timeout=1)
    return proc.returncode, got.get("out", b""), got.get("err", b"")


def _helper(name: str, host: str, timeout_s: float) -> Optional[tuple[str, str]]:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise RegistryError(f"the Docker config names the credential helper {name[:40]!r}, which is not a helper name")
    binary = f"docker-credential-{name}"
    try:
        code, stdout, stderr = _bounded_run([binary, "get"], host.encode(), timeout_s, MAX_HELPER_OUTPUT)
    except FileNotFoundError:
        raise RegistryError(f"the Docker config names the credential helper {name!r} but {binary} is not on PATH; "
                            f"install it or remove it from the config") from None
    except subprocess.TimeoutExpired:
        raise RegistryError(f"{binary} get did not answer within {timeout_s:.0f} s for {host}") from None
    if len(stdout) > MAX_HELPER_OUTPUT or len(stderr) > MAX_HELPER_OUTPUT:
        raise RegistryError(f"{binary} get printed more than {MAX_HELPER_OUTPUT} bytes for {host}; a helper answers "
                            "with one small JSON object")
    if code != 0:
        if b"not found" in (stdout + stderr).lower():
            return None
        raise RegistryError(f"{binary} get failed for {host} (exit {code}); run `docker login {host}`")
    try:
        doc = json.loads(stdout)
        user, secret = doc["Username"], doc["Secret"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{binary} get gave no Username/Secret for {host}") from None
    if not isinstance(user, str) or not isinstance(secret, str):
        raise RegistryError(f"{binary} get gave no Username/Secret for {host}")
    return user, secret


def credentials(host: str, env: Optional[Mapping[str, str]] = None,
                timeout_s: float = HELPER_TIMEOUT_S) -> Optional[tuple[str, str]]:
    """(user, password) for a registry host from the Docker CLI's config, as the engine's client gets them; a
    credential helper has TIMEOUT_S to answer."""
    path, cfg = docker_config(env)
    helpers = cfg.get("credHelpers")
    helper = helpers.get(host) if isinstance(helpers, dict) else None
    if isinstance(helper, str) and helper:
        return _helper(helper, host, timeout_s)
    auths = cfg.get("auths")
    for key, entry in (auths.items() if isinstance(auths, dict) else ()):
        if key.split("://")[-1].split("/")[0] == host and isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, sep = "", ""
            if not sep:
                raise RegistryError(f"{path}: the login for {host} is not base64 of user:password; "
                                    f"run `docker login {host}` again")
            return user, password
    store = cfg.get("credsStore")
    if isinstance(store, str) and store:
        return _helper(store, host, timeout_s)
    return None


def basic(creds: tuple[str, str]) -> str:
    """The Authorization value of a Basic login."""
    return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()

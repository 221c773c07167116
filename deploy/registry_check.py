"""Before a job is submitted that pulls its image: ask the registry for the pinned manifest.

A registry that is down, refuses the credentials or lacks the digest otherwise shows up only as a
failed job (`pyxis: failed to import docker image`, `ErrImagePull`). One HEAD request for
/v2/<repository>/manifests/<digest>, with the scheme recorded at push and the user's `docker login`
credentials for that registry (Basic, or a Bearer token from the registry's realm, as the
distribution spec's token flow gives it), names the cause. Nothing is pulled.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Optional

import requests

from runtime.imageref import ImageRef
from deploy import hint

ACCEPT = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.docker.distribution.manifest.v2+json"])
ENROOT_HTTP2 = ("enroot 4.1 matches 'Authorization: Basic' case-sensitively, while curl prints 'authorization:' "
                "over HTTP/2: if the job still fails with 401, put `http1.1` in the submitting user's ~/.curlrc")


def docker_credentials(registry: str, env: Optional[dict] = None) -> Optional[tuple[str, str]]:
    """(user, password) as `docker login` stored them for REGISTRY (DOCKER_CONFIG or ~/.docker), read
    through the docker SDK's own config loader; None when there are none."""
    import docker.auth
    env = os.environ if env is None else env
    path = Path(env.get("DOCKER_CONFIG") or Path(env.get("HOME", "~")).expanduser() / ".docker") / "config.json"
    if not path.is_file():
        return None
    try:
        found = docker.auth.resolve_authconfig(docker.auth.load_config(config_path=str(path)), registry)
    except Exception:  # an unreadable config or a failing credential helper: ask without credentials
        return None
    return (found["username"], found["password"]) if found and found.get("username") else None


def _bearer(challenge: str, auth: Optional[tuple[str, str]], timeout_s: float) -> Optional[str]:
    """The distribution token flow: GET realm?service=..&scope=.. with the credentials -> token."""
    params = dict(part.split("=", 1) for part in challenge[len("Bearer "):].replace('"', "").split(","))
    realm = params.pop("realm", None)
    if not realm:
        return None
    r = requests.get(realm, params=params, auth=auth, timeout=timeout_s)
    if r.status_code != 200:
        return None
    body = r.json()
    return body.get("token") or body.get("access_token")


def check(ref: ImageRef, scheme: str = "https", auth: Optional[tuple[str, str]] = None,
          timeout_s: float = 10) -> Optional[str]:
    """None when the registry serves the manifest; else the problem, with the fix."""
    registry = ref.registry or "registry-1.docker.io"
    url = f"{'http' if scheme == 'http' else 'https'}://{registry}/v2/{ref.repository}/manifests/{ref.digest}"
    headers = {"Accept": ACCEPT}
    try:
        with warnings.catch_warnings():  # the site's CA may not be this machine's: only the answer is asked
            warnings.simplefilter("ignore")
            r = requests.head(url, headers=headers, auth=auth, timeout=timeout_s, verify=False)
            challenge = r.headers.get("WWW-Authenticate", "")
            if r.status_code == 401 and challenge.startswith("Bearer "):
                token = _bearer(challenge, auth, timeout_s)
                if token:
                    r = requests.head(url, headers={**headers, "Authorization": f"Bearer {token}"},
                                      timeout=timeout_s, verify=False)
    except requests.RequestException as e:
        return (f"image: registry {registry} is unreachable from here ({type(e).__name__}: {str(e)[:160]}); the "
                f"nodes would fail to pull {ref}. Start it or check the address; deploy without --submit to write "
                "the files anyway")
    if r.status_code == 200:
        return None
    if r.status_code in (401, 403):
        how = ("with the credentials of `docker login " + registry + "`") if auth else "without credentials"
        return (f"image: registry {registry} answered {r.status_code} {how}: the nodes would be refused too. Log in "
                f"(`docker login {registry}`; for Pyxis also enroot's credentials file: `machine {registry.split(':')[0]} "
                f"login USER password TOKEN` in $ENROOT_CONFIG_PATH/.credentials; for Kubernetes the "
                f"image_pull_secret). {ENROOT_HTTP2}")
    if r.status_code == 404:
        return (f"image: registry {registry} has no manifest {ref.digest} in {ref.repository} (manifest unknown): "
                f"push it there (`{hint.cmd('push')}`), or deploy the digest that registry holds")
    return f"image: registry {registry} answered {r.status_code} for {ref}; check the registry's logs"

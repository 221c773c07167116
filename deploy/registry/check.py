"""Before a job is submitted that pulls its image: ask the registry for the pinned manifest.

A registry that is down, refuses the credentials or lacks the digest otherwise shows up only as a
failed job (`pyxis: failed to import docker image`, `ErrImagePull`). One HEAD request for
/v2/<repository>/manifests/<digest>, through the same client as the push (the scheme recorded at
push, TLS as the engine verifies it, the user's `docker login`, Basic or a Bearer token), names the
cause. Nothing is pulled.
"""
from __future__ import annotations

from typing import Mapping, Optional

from deploy import hint
from deploy.registry.client import RegistryClient
from deploy.registry.errors import NotFound, RegistryError, RegistryGone, Stalled, Unauthorized
from deploy.registry import auth
from runtime.imageref import ImageRef

ENROOT_HTTP2 = ("enroot 4.1 matches 'Authorization: Basic' case-sensitively, while curl prints 'authorization:' "
                "over HTTP/2: if the job still fails with 401, put `http1.1` in the submitting user's ~/.curlrc")


def check(ref: ImageRef, scheme: str = "https", env: Optional[Mapping[str, str]] = None,
          timeout_s: float = 10) -> Optional[str]:
    """None when the registry serves the manifest; else the problem, with the fix. ENV: where the
    Docker config is found (DOCKER_CONFIG, HOME; default this process's)."""
    registry = ref.registry or "registry-1.docker.io"
    client = RegistryClient(registry, ref.repository, stall_s=timeout_s, scheme="http" if scheme == "http" else "https",
                            env=env)
    try:
        if client.has_manifest(ref.digest):
            return None
        raise NotFound("manifest unknown", 404)
    except (RegistryGone, Stalled) as e:
        return (f"image: registry {registry} is unreachable from here ({e}); the nodes would fail to pull {ref}. "
                "Start it or check the address; deploy without --submit to write the files anyway")
    except Unauthorized as e:
        how = ("with the credentials of `docker login " + registry + "`") if auth.credentials(registry, env) \
            else "without credentials"
        return (f"image: registry {registry} answered {e.status} {how}: the nodes would be refused too. Log in "
                f"(`docker login {registry}`; for Pyxis also enroot's credentials file: `machine {registry.split(':')[0]} "
                f"login USER password TOKEN` in $ENROOT_CONFIG_PATH/.credentials; for Kubernetes the "
                f"image_pull_secret). {ENROOT_HTTP2}")
    except NotFound:
        return (f"image: registry {registry} has no manifest {ref.digest} in {ref.repository} (manifest unknown): "
                f"push it there (`{hint.cmd('push')}`), or deploy the digest that registry holds")
    except RegistryError as e:
        return f"image: {e}; the nodes would fail to pull {ref} (deploy without --submit to write the files anyway)"
    finally:
        client.close()

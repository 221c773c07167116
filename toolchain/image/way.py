"""Where `build` builds: in the Docker engine (toolchain/image/images.py) or on what the registry holds, with no
engine (toolchain/image/registry_build.py). The one place that decides.

The engine is used where the image is wanted in it, or where it holds the project already:
  - `--load` (the image to run with `docker run` here), or the skypilot profile (its layer is made by running
    a container);
  - an engine that holds this project's stages (`<image.repository>-stages`): a machine that builds and runs
    here, whose engine has the layers below a change; its next build loads only what changed, and the local
    target and `--sqsh` find the image there.
Otherwise (a CI runner's fresh engine, a laptop whose engine never built the project) the build is made from
the registry first: the previous push, or the base image.base_image pins there (with none set, the project's own
base there: registry_build.project_base). Its layers are never loaded,
so a dependency change costs its own layer, not the 7 GiB an engine would apply again; the local target and
`--sqsh` put the pushed image in the engine when they need it (loaded from this machine's build, only the layers
the engine lacks, or pulled: deploy/engine_pull.py). Where the registry cannot give the build (nothing pushed yet,
another Python, a base elsewhere), the engine builds it, and one line says why.
The gpu image is never run by this machine's engine (the local target runs the cpu one and asks for no GPU),
so without `--load` it is made for the registry whatever the engine holds, and its CUDA wheels (GiBs) are
never applied by the engine; pipeline.build makes it after the others, whose layers it takes where they are
the same wheels. Where that registry is this tool's local one and the project's base is its own
(debootstrap), the base is put there first (`base_to_local`), as `base.publish` does.
With no engine, the registry's way is the only one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import docker

from runtime import contract as C
from toolchain.config import Settings
from toolchain.docker_client import engine
from toolchain.errors import ConfigError, ToolchainError
from toolchain.image.images import stage_repository


RUN_HERE = ("cpu",)  # the variants the local target runs in this machine's engine


@dataclass(frozen=True)
class Way:
    client: Optional[docker.DockerClient]  # the engine, where one answers
    registry_first: bool                   # build from the registry; where it cannot, in CLIENT (when there is one)
    why: str                               # why not in the engine (the registry build's errors start with it)
    base_to_local: bool = False            # put the project's own base in the local registry first, where it lacks it


def choose(settings: Settings, load: bool, variants: list[str]) -> dict[str, Way]:
    """Each of VARIANTS' way, the engine reached (or found missing) once for all."""
    try:
        client = engine()
    except ToolchainError as e:
        if load:
            raise ConfigError(f"--load: the image goes into the Docker engine, and {e}") from None
        if settings.image.profile == C.SKYPILOT_PROFILE:
            raise ToolchainError(f"{e}; the skypilot profile's layers need one") from None
        return {v: Way(None, True, str(e)) for v in variants}
    if load or settings.image.profile == C.SKYPILOT_PROFILE:
        return {v: Way(client, False, "") for v in variants}
    stages = stage_repository(settings)
    here = Way(client, False, "") if client.images.list(name=stages) else \
        Way(client, True, f"the engine holds no stage of this project ({stages})")
    return {v: here if v in RUN_HERE else
            Way(client, True, f"the engine here does not run the {v} image (`--load` builds it there)", True)
            for v in variants}

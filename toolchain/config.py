"""Typed toolchain settings, read from Invoke's merged configuration (invoke.yaml, INVOKE_* env, flags)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolchain.errors import ConfigError

VARIANTS = ("cpu", "gpu")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BootstrapSettings(_Strict):
    suite: str = "bookworm"
    mirror: str = Field("", description="Debian mirror URL; empty = the first one in the host's apt sources.")
    packages: list[str] = Field(default_factory=lambda: ["python3", "python3-venv", "procps", "iproute2", "tini"])


class TorchSettings(_Strict):
    requirement: str = Field(..., description="Requirement line for torch in this variant.")
    index_url: Optional[str] = Field(None, description="Index holding a special torch build (e.g. CPU-only).")
    index_requirement: Optional[str] = Field(None, description="Requirement to ask index_url for.")


class UserSettings(_Strict):
    name: str = "ray"
    uid: int = Field(1000, ge=1, description="Numeric uid of the image's USER (a kubelet verifies runAsNonRoot by it).")
    gid: int = Field(1000, ge=1, description="Numeric gid of the image's USER and the pods' fsGroup.")


class ImageSettings(_Strict):
    repository: str = "raytrain"
    human_tag: str = "latest"
    variants: list[str] = Field(default_factory=lambda: list(VARIANTS))
    base_image: str = Field("", description="Existing image to build on; empty = bootstrap one with debootstrap.")
    bootstrap: BootstrapSettings = Field(default_factory=BootstrapSettings)
    torch: dict[str, TorchSettings]
    user: UserSettings = Field(default_factory=UserSettings)
    python: str = Field("python3", description="Interpreter in the base image used to create /opt/venv.")


class RegistrySettings(_Strict):
    address: str = "127.0.0.1:5000"
    start_local: bool = True
    data_dir: str = ".registry"
    retries: int = Field(3, ge=0)
    retry_backoff_s: float = Field(2.0, ge=0)


class DeploySettings(_Strict):
    name: str = "example"
    target: str = "local"
    nodes: int = Field(3, ge=1)
    cpus_per_node: int = Field(2, ge=1)
    command: list[str] = Field(default_factory=lambda: ["python", "train.py", "--cpus-per-worker", "0.5"])
    port_base: int = 20000
    time_limit: str = "01:00:00"


class ProjectSettings(_Strict):
    spec: str = "cluster_specs/local.json"
    app_dir: str = "examples/train"
    runtime_dir: str = Field("runtime", description="The in-image runtime package copied into the app layer.")
    requirements: list[str] = Field(default_factory=lambda: ["runtime/requirements.txt"])
    build_dir: str = "build"


class Settings(_Strict):
    root: Path
    project: ProjectSettings = Field(default_factory=ProjectSettings)
    image: ImageSettings
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    quiet: bool = False

    def path(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.root / p

    @property
    def build_dir(self) -> Path:
        return self.path(self.project.build_dir)


def _plain(obj: Any) -> Any:
    """Invoke's DataProxy -> plain dicts/lists."""
    if hasattr(obj, "items"):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def load_settings(config: Any, root: Path) -> Settings:
    data = {k: _plain(config.get(k)) for k in ("project", "image", "registry", "deploy") if config.get(k) is not None}
    data["quiet"] = bool(config.get("quiet", False))
    try:
        settings = Settings(root=root, **data)
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError("invalid toolchain configuration (invoke.yaml / INVOKE_* variables):\n  - " + "\n  - ".join(lines)) from None
    for v in settings.image.variants:
        if v not in VARIANTS:
            raise ConfigError(f"image.variants: unknown variant {v!r}; use one of {', '.join(VARIANTS)}")
        if v not in settings.image.torch:
            raise ConfigError(f"image.torch.{v}: missing; give the torch requirement for variant {v!r}")
    return settings

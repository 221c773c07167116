"""What an image's dependency layers were made from, carried by the image itself: the top-level field
`io.raytrain.layers` of its config.

A build on another machine (a fresh CI runner: no cache, no Docker engine) reads it from the image a
previous push left in the registry (toolchain/image/registry_build.py) and knows, without a wheel or a layer,
each dependency layer's key, diff ID, wheels (file, sha256, unpacked size: what the layer plan needs)
and console scripts (what the venv's top layer needs), the stage below them (the base and user layers,
by count, and the user stage's key) and the interpreter they were made for.

Why a field of the config, not manifest annotations or an artifact beside the image: the config is
content-addressed (its digest is the image ID, which the manifest pins), it is the one document such a
build must read anyway (the diff IDs), and it travels with every copy of the image, where annotations
are dropped by a re-push and an artifact is a second thing to keep in step. Not a label: containerd
copies an image's labels to each container and refuses one over 4,096 bytes (this one is about 22 KiB
for the example), and consumers ignore a field they do not know.

What is read back is untrusted: the label is parsed into the model below (bounded, every field typed),
and a layer's key must equal the key this build computes from the lock's sha256s, or the layer is made
again from the wheel.
"""
from __future__ import annotations

import json
import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.digest import Digest, DigestError
from toolchain.image.venv_layer import is_script_name

FIELD = "io.raytrain.layers"
FORMAT = 1
MAX_LABEL = 4 << 20
_HEX = r"^[0-9a-f]{64}$"
_WHEEL = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}\.whl$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class WheelFact(_Model):
    file: str = Field(..., pattern=_WHEEL)
    sha256: str = Field(..., pattern=_HEX)
    size: int = Field(..., ge=0, le=1 << 42)   # unpacked bytes
    modules: bool                              # ships MODULE_BYTES or more of Python source


class LayerFact(_Model):
    key: str = Field(..., pattern=_HEX)
    diff_id: str
    wheels: list[str] = Field(..., min_length=1, max_length=100_000)
    scripts: list[tuple[str, str]] = Field(default_factory=list, max_length=10_000)

    @field_validator("diff_id")
    @classmethod
    def _digest(cls, v: str) -> str:
        return Digest(v, "diff_id")

    @field_validator("scripts")
    @classmethod
    def _scripts(cls, v: list) -> list:
        for name, _ in v:
            if not is_script_name(name):
                raise ValueError(f"the console script name {name[:80]!r} is not one a wheel may install")
        return v


class Provenance(_Model):
    format: Literal[1]
    user_key: str = Field(..., pattern=_HEX)
    lower_layers: int = Field(..., ge=1, le=120)   # the base's and the user stage's layers, at the bottom
    python: tuple[str, str, str, str]               # version, executable, magic, cache tag (venv_layer.Python)
    compiler: Optional[list]                        # bytecode.identity of the host that compiled, None: none did
    venv: str = Field(..., pattern=r"^/[A-Za-z0-9_./-]{1,200}$")
    wheels: list[WheelFact] = Field(..., max_length=100_000)
    layers: list[LayerFact] = Field(..., max_length=1_000)

    def text(self) -> str:
        """The field's value: canonical JSON, so equal inputs give equal image configs."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def by_key(self) -> dict[str, LayerFact]:
        return {layer.key: layer for layer in self.layers}


class ProvenanceError(ValueError):
    """A label that is not one this tool wrote (the message says what)."""


def parse(text: object) -> Provenance:
    """The field's value as the model; ProvenanceError naming the first field that is not right."""
    if not isinstance(text, str) or len(text) > MAX_LABEL:
        raise ProvenanceError(f"the field {FIELD} is not text of at most {MAX_LABEL} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise ProvenanceError(f"the field {FIELD} is not JSON") from None
    if isinstance(doc, dict) and isinstance(doc.get("python"), list):
        doc["python"] = tuple(doc["python"])
    if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
        for layer in doc["layers"]:
            if isinstance(layer, dict) and isinstance(layer.get("scripts"), list):
                layer["scripts"] = [tuple(s) if isinstance(s, list) else s for s in layer["scripts"]]
    try:
        return Provenance.model_validate(doc)
    except (ValidationError, DigestError) as e:
        if isinstance(e, DigestError):
            raise ProvenanceError(f"the field {FIELD}: {e}") from None
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(the field)"
        raise ProvenanceError(f"the field {FIELD}: {where}: {re.sub(r'^Value error, ', '', err['msg'])}") from None


def of_build(user_key: str, lower_layers: int, python, compiler: Optional[list], venv: str,
             sha256: dict[str, str], measured: dict[str, tuple[int, bool]], planned: list,
             made: list[tuple[str, list[tuple[str, bytes]]]]) -> Provenance:
    """The provenance of the layers PLANNED (venv_plan.PlannedLayer) as they came out: MADE is each one's
    (diff ID, console scripts), in order; SHA256 and MEASURED by wheel file name."""
    files = sorted({w.name for p in planned for w in p.wheels})
    return Provenance(
        format=FORMAT, user_key=user_key, lower_layers=lower_layers,
        python=(python.version, python.executable, python.magic, python.cache_tag), compiler=compiler, venv=venv,
        wheels=[WheelFact(file=f, sha256=sha256[f], size=measured[f][0], modules=measured[f][1]) for f in files],
        layers=[LayerFact(key=p.key, diff_id=d, wheels=[w.name for w in p.wheels],
                          scripts=[(n, t.decode("utf-8", "surrogateescape")) for n, t in scripts])
                for p, (d, scripts) in zip(planned, made)])

"""The image a push's tag names in the registry before the push (what an earlier push left there): which
compressed blob holds each of its layers.

A runner with an empty blob cache (a fresh CI runner) knows a layer by its diff ID only, and would compress
every layer to learn the blob digest the registry names it by, only to find the registry has it. The
previous image's manifest (blob digests, in order) and config (diff IDs, in the same order) pair them
without compressing anything; the push then asks the registry for each blob as for one it compressed
before (toolchain/publish/push.py).

What is taken from the registry is checked: the manifest is a single-platform schema2 or OCI manifest, the
config is the blob its digest names, it lists as many diff IDs as the manifest lists layers, and only gzip
layers are paired (the push's manifests say gzip). A previous image that fails a check is said in one
line, naming it, and the push goes on without it (it replaces that tag).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from deploy.registry.client import MANIFEST_V2, RegistryClient
from deploy.registry.errors import RegistryError
from runtime.digest import Digest, DigestError
from toolchain.progress import Reporter

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
GZIP_LAYERS = ("application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.oci.image.layer.v1.tar+gzip")
LISTS = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class HeldBlob:
    """A layer's blob the registry holds: what a manifest lists for it."""
    digest: Digest
    size: int


class PreviousImageError(ValueError):
    """The previous image is not one whose layers can be paired (the message says what and where)."""


def pair_layers(manifest: bytes, media_type: str, config: bytes) -> dict[Digest, HeldBlob]:
    """diff ID -> blob of each gzip layer of an image, from its manifest and config; PreviousImageError
    naming what does not parse."""
    try:
        doc = json.loads(manifest)
    except (ValueError, RecursionError):
        raise PreviousImageError("its manifest is not JSON") from None
    kind = doc.get("mediaType", media_type) if isinstance(doc, dict) else media_type
    if kind in LISTS or (isinstance(doc, dict) and "manifests" in doc):
        raise PreviousImageError("it is a list of platforms, not one image")
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or kind not in (MANIFEST_V2, OCI_MANIFEST):
        raise PreviousImageError(f"its manifest is not a schema 2 or OCI image manifest (media type {str(kind)[:80]!r})")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not all(isinstance(l, dict) for l in layers):
        raise PreviousImageError("its manifest's layers are not a list of descriptors")
    try:
        cfg = json.loads(config)
        diff_ids = cfg["rootfs"]["diff_ids"]
    except (ValueError, RecursionError, KeyError, TypeError):
        raise PreviousImageError("its config has no rootfs.diff_ids") from None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise PreviousImageError(f"its config lists {len(diff_ids) if isinstance(diff_ids, list) else 'no'} diff IDs "
                                 f"for the manifest's {len(layers)} layers")
    out: dict[Digest, HeldBlob] = {}
    for i, (diff_id, layer) in enumerate(zip(diff_ids, layers)):
        size = layer.get("size")
        try:
            d, blob = Digest(diff_id, f"diff ID {i}"), Digest(layer.get("digest"), f"layer {i}'s digest")
        except DigestError as e:
            raise PreviousImageError(str(e)) from None
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise PreviousImageError(f"layer {i}'s size {str(size)[:40]!r} is not a blob's size")
        if layer.get("mediaType") in GZIP_LAYERS:
            out[d] = HeldBlob(blob, size)
    return out


def image_layers(reg: RegistryClient, reference: str) -> dict[Digest, HeldBlob] | None:
    """The layers of the image REG's repository holds under REFERENCE (a tag or digest), paired with their
    blobs; None when it holds none; PreviousImageError or RegistryError when it cannot be read."""
    found = reg.get_manifest(reference)
    if found is None:
        return None
    manifest, media_type = found
    config_digest = _config_digest(manifest)
    config = reg.get_small_blob(config_digest, "the image's config")
    if config is None:
        raise PreviousImageError(f"its config {config_digest.short} is not in the registry")
    return pair_layers(manifest, media_type, config)


def held_layers(reg: RegistryClient, tags: Sequence[str], rep: Reporter) -> dict[Digest, HeldBlob]:
    """The layers of the images REG's repository holds under TAGS now, paired with their blobs; a tag that
    is not there adds nothing, one whose image fails a check is said (a warning) and adds nothing."""
    out: dict[Digest, HeldBlob] = {}
    for tag in dict.fromkeys(tags):
        where = f"{reg.host}/{reg.repo}:{tag}"
        try:
            pairs = image_layers(reg, tag)
        except (PreviousImageError, RegistryError) as e:
            rep.warn(f"the image {where} holds now (a previous push) is not used to skip compressing its layers: {e}")
            continue
        if pairs is None:
            continue
        rep.detail(f"{where}: {len(pairs)} layer(s) the registry holds, known without compressing them")
        out.update(pairs)
    return out


def _config_digest(manifest: bytes) -> Digest:
    try:
        doc = json.loads(manifest)
        return Digest(doc["config"]["digest"], "the config's digest")
    except (ValueError, RecursionError, KeyError, TypeError, DigestError) as e:
        raise PreviousImageError(f"its manifest names no config ({str(e)[:120] or type(e).__name__})") from None

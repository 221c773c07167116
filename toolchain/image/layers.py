"""Image layers that are only files, assembled directly (no Dockerfile builder), reproducibly.

A thin layer (the app, the spec) is an uncompressed tar built in memory (`make_layer`), with
sorted entries, every parent directory listed, a fixed mtime,
uid/gid 0 with no names, modes normalised (0755 directories and executables, 0644 other files)
and no host metadata: the same sources give the same bytes, hence the same diff ID, from any
checkout path, clone or mtime. The image config is written from the lower image's config plus
what the layer adds (env, labels), with a fixed creation time, as canonical JSON: its sha256 is
the image ID. A dependency layer (toolchain/image/venv_layer.py) is a `FileLayer`: a tar on disk in the
layer store, never held in memory. `load()` streams the engine a docker-archive holding only
the new layers; the lower layers are listed by diff ID and the engine, which has their chain, does
not ask for them.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Optional, Union

import docker

from deploy.layer_store import LayerStore
from runtime.contract import BIG_LAYER_BYTES
from runtime.digest import Digest
from toolchain.errors import BuildError
from toolchain.hashing import iter_tree

LAYER_FORMAT = 1  # bump when what make_layer/image_config produce changes, so old stage tags are not reused
MTIME = 0
CREATED = "1970-01-01T00:00:00Z"
# the parts of an image config a layer on top inherits (the engine's inspect output has more)
CONFIG_KEYS = ("User", "Env", "Entrypoint", "Cmd", "WorkingDir", "Labels", "Volumes", "ExposedPorts", "StopSignal")


CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """A thin layer, in memory."""
    data: bytes

    @property
    def diff_id(self) -> str:
        return Digest.of(self.data)

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self) -> Iterator[bytes]:
        yield self.data


@dataclass(frozen=True)
class FileLayer:
    """A layer whose tar is a file (written once, hashed while written: `diff_id` is its sha256)."""
    path: Path
    diff_id: Digest
    size: int

    def chunks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            while block := f.read(CHUNK):
                yield block


def tar_header(info: tarfile.TarInfo) -> bytes:
    """One entry's header as the layers write it: PAX (long names, sizes past 8 GiB), UTF-8."""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


TAR_END = b"\0" * (2 * tarfile.BLOCKSIZE)


def files_under(src: Path, dest: str) -> list[tuple[str, bytes, bool]]:
    """(path in the image, content, executable) for the files of a source tree (caches skipped)."""
    out = []
    for f in iter_tree(src):
        rel = f.relative_to(src).as_posix()
        out.append((f"{dest.rstrip('/')}/{rel}", f.read_bytes(), bool(os.stat(f).st_mode & 0o111)))
    return out


def make_layer(files: Iterable[tuple[str, bytes, bool]], owned: Optional[dict[str, tuple[int, int]]] = None) -> Layer:
    """A layer of FILES (path in the image, content, executable), every entry root's, but those at or under
    a directory of OWNED ({path: (uid, gid)}), which are that owner's."""
    entries = {str(PurePosixPath("/", p)).lstrip("/"): (data, exe) for p, data, exe in files}
    dirs = {str(parent) for p in entries for parent in PurePosixPath(p).parents if str(parent) != "."}
    owners = [(str(PurePosixPath("/", d)).lstrip("/"), ids) for d, ids in (owned or {}).items()]

    def owner(name: str) -> tuple[int, int]:
        return next((ids for d, ids in owners if name == d or name.startswith(d + "/")), (0, 0))
    out: dict[str, Entry] = {d: (None, 0o755, *owner(d), MTIME) for d in dirs}
    out.update({name: (data, 0o755 if exe else 0o644, *owner(name), MTIME) for name, (data, exe) in entries.items()})
    return tar_layer(out)


Entry = tuple[Optional[bytes], int, int, int, int]  # (bytes, or None for a directory; mode, uid, gid, mtime)


def tar_layer(entries: dict[str, Entry]) -> Layer:
    """A reproducible layer of ENTRIES (path in the image without the leading /): sorted, every parent
    directory listed (root's, 0755, unless ENTRIES has it), no user or group names, PAX format."""
    parents = {str(p) for e in entries for p in PurePosixPath(e).parents if str(p) != "."}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(parents | set(entries)):
            data, mode, uid, gid, mtime = entries.get(path, (None, 0o755, 0, 0, MTIME))
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid, info.mtime, info.uname, info.gname = mode, uid, gid, mtime, "", ""
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return Layer(buf.getvalue())


def lower_of(config: dict) -> dict:
    """An image's config as the registry holds it, as the engine's inspect attrs give the parts `image_config`
    reads of a lower image (Config, Architecture, Os, RootFS)."""
    return {"Config": config.get("config") or {}, "Architecture": config.get("architecture", "amd64"),
            "Os": config.get("os", "linux"),
            "RootFS": {"Layers": list((config.get("rootfs") or {}).get("diff_ids") or [])}}


def image_config(lower: dict, diff_ids: list[str], env: dict | None = None, labels: dict | None = None,
                 extra: dict | None = None, fields: dict | None = None) -> bytes:
    """The config of an image of `lower` (the engine's inspect attrs) plus layers, env and labels; FIELDS:
    the run config's own (User, WorkingDir, Cmd) set over the lower's; EXTRA: top-level fields of this
    tool's own (consumers ignore them; a label would be copied to every container)."""
    cfg = {k: lower["Config"][k] for k in CONFIG_KEYS if (lower.get("Config") or {}).get(k) is not None}
    cfg.update({k: v for k, v in (fields or {}).items() if k in CONFIG_KEYS})
    if env:
        kept = [e for e in cfg.get("Env", []) if e.split("=", 1)[0] not in env]
        cfg["Env"] = kept + [f"{k}={v}" for k, v in env.items()]
    if labels:
        cfg["Labels"] = {**cfg.get("Labels", {}), **labels}
    # one history entry per layer: a registry that converts a manifest to schema 1 for a client asking
    # without an Accept header (distribution 2.8 does, for enroot's pulls by tag) refuses an empty history
    history = [{"created": CREATED, "created_by": "raytrain layer"} for _ in diff_ids]
    doc = {"architecture": lower.get("Architecture", "amd64"), "os": lower.get("Os", "linux"), "created": CREATED,
           "config": cfg, "history": history, "rootfs": {"type": "layers", "diff_ids": diff_ids}, **(extra or {})}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


AnyLayer = Union[Layer, FileLayer]


def _write_once(path: Path, data: bytes) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        tmp.write_bytes(data)
        tmp.replace(path)


def keep(layer: AnyLayer, store: LayerStore) -> Path:
    """Keep the layer's tar in the store (written whole or not at all), for consumers that need a layer's
    files without a 7 GB `docker save`: the incremental .sqsh (deploy/targets/pyxis/enroot_incremental.py)
    and the push (toolchain/publish/blobs.py). A FileLayer is written there in the first place."""
    path = store.tar(layer.diff_id)
    if isinstance(layer, FileLayer):
        if layer.path != path:
            raise ValueError(f"{layer.path} is not in the layer store {store}")
        return path
    _write_once(path, layer.data)
    return path


KEEP_BIG = 2


def prune_big(store: LayerStore, keep: set[Path]) -> list[Path]:
    """Delete all but the KEEP_BIG newest big layer tars not in KEEP (a torch bump writes a new 1.7 GB
    layer; older ones are only a shortcut for a push or a build, which write them again or read the engine)."""
    return store.prune_big(keep, KEEP_BIG, BIG_LAYER_BYTES)


def keep_config(config: bytes, store: LayerStore) -> Path:
    """Keep an assembled image's config in the store: the push sends these exact bytes."""
    path = store.config(Digest.of(config))
    _write_once(path, config)
    return path


def _archive(configs: list[tuple[str, bytes]], new: list[AnyLayer], manifest: bytes) -> Iterator[bytes]:
    """A docker-archive, streamed: the configs (name, bytes), the new layers' tars (read in chunks) and the manifest."""
    def entry(name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size, info.mtime = size, MTIME
        return tar_header(info)
    for name, config in configs:
        yield entry(name, len(config)) + config + tar_padding(len(config))
    for layer in new:
        yield entry(f"{Digest(layer.diff_id).hex}/layer.tar", layer.size)
        yield from layer.chunks()
        yield tar_padding(layer.size)
    yield entry("manifest.json", len(manifest)) + manifest + tar_padding(len(manifest)) + TAR_END


def load(client, new: list[AnyLayer], config: bytes, tag: str, store: LayerStore | Path | None = None, progress=None) -> str:
    """Load the image of CONFIG (only the NEW layers travel, streamed; the config's other layers the
    engine has) and tag it TAG; returns its ID (sha256 of the config). With `store`, the new layers
    and the config are kept there too (`keep`, `keep_config`). `progress(bytes sent)` is called as the
    archive streams."""
    return load_images(client, new, [(config, tag)], store, progress)[0]


def load_images(client, new: list[AnyLayer], images: list[tuple[bytes, str]], store: LayerStore | Path | None = None,
                progress=None, applying: Optional[Callable[[dict], None]] = None) -> list[str]:
    """`load` of several images in one docker-archive: one request, and one unpacking by the engine,
    for a stage and the stage above it. IMAGES are (config, tag), bottom first: each image's layers
    are its config's diff IDs, and the engine takes the first image's before the next one's, so a
    layer of NEW that the first brings is already there for the second. Returns the images' IDs.
    `applying(event)` gets each of the engine's "Loading layer" events (its `id` and `progressDetail`): the
    engine takes the whole archive first, then applies the layers, the long part."""
    store = LayerStore.of(store) if store is not None else None
    ids = [Digest.of(config) for config, _ in images]
    manifest = json.dumps([{"Config": f"{image_id.hex}.json", "RepoTags": [tag],
                            "Layers": [f"{Digest(d).hex}/layer.tar" for d in json.loads(config)["rootfs"]["diff_ids"]]}
                           for image_id, (config, tag) in zip(ids, images)]).encode()

    def counted() -> Iterator[bytes]:
        sent = 0
        for block in _archive([(f"{i.hex}.json", config) for i, (config, _) in zip(ids, images)], new, manifest):
            sent += len(block)
            if progress is not None:
                progress(sent)
            yield block
    tags = ", ".join(tag for _, tag in images)
    try:
        for event in client.api.load_image(counted(), quiet=applying is None):
            if "errorDetail" in event:
                raise docker.errors.ImageLoadError((event["errorDetail"] or {}).get("message") or str(event))
            if applying is not None and event.get("status") == "Loading layer":
                applying(event)
    except Exception as e:  # the engine's message says which layer it missed
        raise BuildError("assembled", tags, f"the engine did not load the assembled image: {e}", []) from None
    for image_id, (config, tag) in zip(ids, images):
        if client.images.get(tag).id != image_id:
            raise BuildError("assembled", tag, f"the engine gave the image another ID than {image_id}", [])
        if store is not None:
            keep_config(config, store)
    if store is not None:
        for layer in new:
            keep(layer, store)
    return ids

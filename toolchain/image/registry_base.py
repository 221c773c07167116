"""A base image in a registry, read with no engine: what a first build on a fresh runner needs of it.

`image.base_image` pinned in the registry the image is pushed to (registry/repository@sha256:...) is all
such a build has of its base. From the registry, without running anything:
  - its manifest and config: the run config the image's stages start from, and each layer's blob by
    diff ID, which the push mounts into the image's repository (never downloaded for the image);
  - its /etc, for the user layer (toolchain/image/user_layer.py), and its Python, as `Builder.python`'s probe
    in a container prints them:
      executable  the first directory of the config's PATH that holds image.python, joined with it (the
                  interpreter's sys.executable when a container runs it by name)
      version     the PY_VERSION string compiled into the interpreter the links lead to, or into its
                  libpython (a shared build's executable holds none)
      magic       the header of the standard library's compiled importlib/_bootstrap_external, else the
                  MAGIC_NUMBER its source sets
      cache tag   cpython-<major><minor>
For those files the layers are streamed once, bottom first, each checked against its digest: every
entry's name, type and link is kept (to follow links and apply whiteouts, as the engine stacks the
layers), and the bytes of those few files only. A base of a few hundred MB compressed is read in seconds;
what is read is said.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Optional

from deploy.registry.client import RegistryClient
from deploy.registry.errors import RegistryError
from runtime.digest import Digest
from runtime.imageref import ImageRef
from toolchain.errors import ToolchainError
from toolchain.image.previous_image import HeldBlob, PreviousImageError, pair_layers
from toolchain.image.user_layer import ACCOUNT_FILES, SUBID_FILES, BaseEtc, UserLayerError, read_etc
from toolchain.image.venv_layer import Python
from toolchain.progress import Reporter, human_bytes

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the engine's when a config sets none
_KEPT_ETC = {f"etc/{f}" for f in (*ACCOUNT_FILES, *SUBID_FILES, "login.defs")}
_INTERPRETER = re.compile(r"python3(\.\d+)?|libpython3\.\d+\.so(\.[\d.]+)?")
_MAGIC_FILES = re.compile(r".*/lib/python3\.\d+/importlib/(_bootstrap_external\.py"
                          r"|__pycache__/_bootstrap_external\.cpython-3\d+\.pyc)")
_MAGIC_SOURCE = re.compile(rb"^MAGIC_NUMBER = \((\d+)\)\.to_bytes\(2, 'little'\) \+ b'\\r\\n'", re.M)
_MAX_KEPT = 64 << 20  # an interpreter or libpython is a few to a few tens of MB
_MAX_LINKS = 40


class BaseImageError(ToolchainError):
    """The base cannot be used as it is in the registry (the message names it and says what to do)."""


@dataclass(frozen=True)
class _Entry:
    info: tarfile.TarInfo
    data: Optional[bytes] = None  # kept for the few files read


@dataclass(frozen=True)
class RegistryBase:
    ref: ImageRef                   # registry/repository@sha256:..., the image.base_image given
    config: dict                    # its config, as the registry holds it (its layers: rootfs.diff_ids)
    etc: BaseEtc
    python: Python


def read_base(ref: ImageRef, python_name: str, stall_s: float, rep: Reporter,
              named: str = "image.base_image") -> RegistryBase:
    """The base REF names (pinned, in a registry): its config, layers, /etc and Python; BaseImageError
    naming it as NAMED (the setting, or what put it there) and what is wrong."""
    where = f"{named} {ref.docker()}"
    reg = RegistryClient(ref.registry, ref.repository, stall_s)
    try:
        found = reg.get_manifest(str(ref.digest))
        if found is None:
            raise BaseImageError(f"{where}: the registry has no such image; push the base there first "
                                 "(`raytrain base.publish`, or skopeo copy) and name the digest it printed")
        manifest, media_type = found
        config_digest = Digest(json.loads(manifest)["config"]["digest"], "its config's digest")
        config_bytes = reg.get_small_blob(config_digest, "the base's config")
        if config_bytes is None:
            raise BaseImageError(f"{where}: its config {config_digest.short} is not in the registry")
        held = pair_layers(manifest, media_type, config_bytes)
        config = json.loads(config_bytes)
        diff_ids = [Digest(d, "a diff ID of the base") for d in config["rootfs"]["diff_ids"]]
        if [d for d in diff_ids if d not in held]:
            raise BaseImageError(f"{where}: a layer of it is not gzip-compressed; give a base whose layers are "
                                 "(docker push and skopeo copy write them so)")
        tree = _read_tree(reg, diff_ids, held, ref.docker(), where, rep)
    except (PreviousImageError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BaseImageError(f"{where}: {str(e)[:300]}; give a single-platform image's digest") from None
    except RegistryError as e:
        raise BaseImageError(f"{where}: {e}") from None
    finally:
        reg.close()
    try:
        etc = read_etc(_etc_tar(tree))
    except UserLayerError as e:
        raise BaseImageError(f"{where}: {e}") from None
    env = dict(e.split("=", 1) for e in (config.get("config") or {}).get("Env") or [] if "=" in e)
    python = find_python(tree, python_name, env.get("PATH", DEFAULT_PATH), where)
    return RegistryBase(ref, config, etc, python)


def _read_tree(reg: RegistryClient, diff_ids: list[Digest], held: dict[Digest, HeldBlob], shown: str, where: str,
               rep: Reporter) -> dict[str, _Entry]:
    """Every path of the base's filesystem, as its layers stack: (its tar entry, the bytes of the few kept)."""
    tree: dict[str, _Entry] = {}
    total = sum(held[d].size for d in diff_ids)
    rep.step(f"base: reading /etc and the Python of {shown} from its {len(diff_ids)} layer(s) ({human_bytes(total)})")
    t0 = time.monotonic()
    for i, d in enumerate(diff_ids):
        blob = held[d]
        try:
            got = reg.read_blob(blob.digest, f"layer {i + 1} of the base", _read_layer)
        except (tarfile.TarError, zlib.error, EOFError) as e:
            raise BaseImageError(f"{where}: its layer {blob.digest.short} is not a gzip tar "
                                 f"({type(e).__name__}: {str(e)[:120]})") from None
        if got is None:
            raise BaseImageError(f"{where}: its layer {blob.digest.short} is not in the registry")
        entries, gone, opaque = got
        for path in opaque:  # what the lower layers had under an opaque directory is hidden
            for p in [p for p in tree if p.startswith(path + "/")]:
                del tree[p]
        for path in gone:
            tree.pop(path, None)
            for p in [p for p in tree if p.startswith(path + "/")]:
                del tree[p]
        tree.update(entries)
    rep.detail(f"base: {len(tree)} paths read in {time.monotonic() - t0:.1f}s")
    return tree


def _read_layer(stream) -> tuple[dict[str, _Entry], list[str], list[str]]:
    """(entries, whited-out paths, opaque directories) of one gzip layer stream."""
    entries: dict[str, _Entry] = {}
    gone, opaque = [], []
    with tarfile.open(fileobj=stream, mode="r|gz", bufsize=1 << 20) as tf:
        for m in tf:
            path = _clean(m.name)
            if not path:
                continue
            parent, _, leaf = path.rpartition("/")
            if leaf == ".wh..wh..opq":
                opaque.append(parent)
                continue
            if leaf.startswith(".wh."):
                gone.append(f"{parent}/{leaf[4:]}" if parent else leaf[4:])
                continue
            data = None
            if m.isfile() and _kept(path) and m.size <= _MAX_KEPT:
                data = tf.extractfile(m).read()
            m.name, m.pax_headers = path, {}  # (a pax path header would name it again when /etc is written out)
            entries[path] = _Entry(m, data)
    return entries, gone, opaque


def _clean(name: str) -> str:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return "/".join(parts)


def _kept(path: str) -> bool:
    return (path in _KEPT_ETC or path.startswith("etc/skel/") or bool(_MAGIC_FILES.fullmatch(path))
            or bool(_INTERPRETER.fullmatch(path.rpartition("/")[2])))


def _etc_tar(tree: dict[str, _Entry]) -> bytes:
    """The base's /etc files the user layer reads, as a tar (what user_layer.read_etc parses)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tf:
        for path in sorted(p for p in tree if p in _KEPT_ETC or p.startswith("etc/skel/")):
            e = tree[path]
            if e.info.isfile() and e.data is not None:
                tf.addfile(e.info, io.BytesIO(e.data))
            elif e.info.isdir():
                tf.addfile(e.info)
    return buf.getvalue()


def resolve(tree: dict[str, _Entry], path: str) -> Optional[str]:
    """PATH (absolute) with every symbolic link in it followed, as the kernel would in the image; None when
    it leads nowhere (or in circles)."""
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/".join([*done, part])
        e = tree.get(here)
        if e is None:
            if not todo:
                return None
            done.append(part)  # a directory a layer holds files in without an entry of its own
            continue
        if e.info.issym():
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = e.info.linkname
            todo = [p for p in target.split("/") if p] + todo
            if target.startswith("/"):
                done = []
            continue
        if e.info.islnk():  # a hard link names the path it shares its file with
            here = _clean(e.info.linkname)
            if here not in tree:
                return None
        done = here.split("/")
    return "/".join(done)


def find_python(tree: dict[str, _Entry], name: str, path_var: str, where: str) -> Python:
    """The base's interpreter NAME (image.python) as the probe in a container reports it (the module's
    docstring); BaseImageError when it is not there or cannot be told from its files."""
    candidates = [name] if name.startswith("/") else [f"{d.rstrip('/')}/{name}" for d in path_var.split(":") if d]
    executable = real = None
    for c in candidates:
        r = resolve(tree, c)
        if r is not None and tree[r].info.isfile() and tree[r].info.mode & 0o111:
            executable, real = c, r
            break
    if executable is None:
        raise BaseImageError(f"{where}: it has no {name} on its PATH ({path_var}); use a base with Python 3 "
                             "(image.python names the interpreter)")
    m = re.fullmatch(r"python3\.(\d+)", real.rpartition("/")[2])
    prefix = str(PurePosixPath("/" + real).parent.parent).lstrip("/")
    minors = [m[1]] if m else sorted({p.split("/python3.")[1].split("/")[0] for p in tree
                                      if p.startswith(f"{prefix}/lib/python3.") and p.count("/") == prefix.count("/") + 2})
    if len(minors) != 1:
        raise BaseImageError(f"{where}: cannot tell which Python 3 {executable} ({real}) is; name the versioned "
                             "interpreter in image.python (e.g. python3.11)")
    minor = minors[0]
    version = _version(tree, real, prefix, minor)
    if version is None:
        raise BaseImageError(f"{where}: {executable} ({real}) holds no Python 3.{minor} version string; is it CPython?")
    magic = _magic(tree, f"{prefix}/lib/python3.{minor}/importlib", minor)
    if magic is None:
        raise BaseImageError(f"{where}: its Python 3.{minor} has no importlib/_bootstrap_external under "
                             f"/{prefix}/lib/python3.{minor} to read its bytecode's magic number from")
    return Python(version, executable if executable.startswith("/") else "/" + executable, magic, f"cpython-3{minor}")


def _version(tree: dict[str, _Entry], real: str, prefix: str, minor: str) -> Optional[str]:
    pattern = re.compile(rb"(?<![\d.])(3\." + minor.encode() + rb"\.\d+(?:(?:a|b|rc)\d+)?\+?)\x00")
    libs = sorted(p for p, e in tree.items() if e.data is not None and
                  re.fullmatch(rf"(.*/)?libpython3\.{minor}\.so(\.[\d.]+)?", p) and p.startswith(prefix + "/lib"))
    for path in [real, *libs]:
        e = tree.get(resolve(tree, path) or "")
        if e is None or e.data is None:
            continue
        found = {m[1].decode() for m in pattern.finditer(e.data)}
        if len(found) == 1:
            return found.pop()
    return None


def _magic(tree: dict[str, _Entry], importlib: str, minor: str) -> Optional[str]:
    pyc = tree.get(f"{importlib}/__pycache__/_bootstrap_external.cpython-3{minor}.pyc")
    if pyc is not None and pyc.data and len(pyc.data) >= 16 and pyc.data[2:4] == b"\r\n":
        return pyc.data[:4].hex()
    src = tree.get(f"{importlib}/_bootstrap_external.py")
    m = _MAGIC_SOURCE.search(src.data) if src is not None and src.data else None
    return (int(m[1]).to_bytes(2, "little") + b"\r\n").hex() if m else None

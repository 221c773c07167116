"""The SkyPilot image profile (`build --profile skypilot`): the finished image plus what SkyPilot's
Kubernetes pod setup needs of it (dockerfiles/skypilot.Dockerfile.j2), as layers on top.

SkyPilot starts every pod of a cluster with its own setup script, run as the image's user: it needs
that user to become root (`sudo`: sshd, limits), installs `rsync curl wget netcat gcc patch pciutils
openssh-server` with apt when they are missing, fetches `uv` from astral.sh when ~/.local/bin/uv is
missing, then makes its own runtime with uv (Python 3.10, skypilot and ray from PyPI). The profile
carries the packages and uv, so a pod needs no apt and no astral.sh; the runtime download stays
SkyPilot's (docs/deploying.md says what a cluster without the internet needs).

The layers are made once per user stage: a Dockerfile stage on the user stage (the only place they
can be, since /etc/passwd and dpkg's status are the user stage's), whose layers above the user
stage's are read back and put on top of the spec layer. Nothing in the layers between (the venv at
/opt/venv, the app at /app, the spec at /etc/raytrain) is touched by them, so the result is the image
the stage would give, and every layer below is shared with the default image (one copy in the engine,
in the registry and on every node).
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import docker

from runtime.contract import PROFILE_LABEL, SKYPILOT_PROFILE
from deploy.layer_store import LayerStore
from runtime.digest import Digest
from runtime.imageref import ImageRef
from toolchain.image import layers
from toolchain.publish.blobs import file_sha256
from toolchain.docker_client import image_exists
from toolchain.errors import BuildError
from toolchain.hashing import key_of
from toolchain.progress import Reporter
from toolchain.image.templates import render, template_hash

PACKAGES = ("sudo", "ca-certificates", "curl", "wget", "rsync", "netcat-openbsd", "openssh-server", "pciutils",
            "patch", "gcc")
UV = "uv==0.13.9"
UV_WHEEL = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
UV_SHA256 = "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"
UV_MEMBER = "uv-0.13.9.data/scripts/uv"


def uv_binary(cache: Path, rep: Reporter) -> Path:
    """The pinned uv binary, from its wheel on PyPI (checked against UV_SHA256), kept under CACHE."""
    out = cache / f"uv-{UV_SHA256[:16]}"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / UV_WHEEL
    if not wheel.is_file() or file_sha256(wheel).hex != UV_SHA256:
        rep.step(f"skypilot profile: downloading {UV} for ~/.local/bin/uv")
        res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11", "-d", str(cache), UV],
                             capture_output=True, text=True)
        if res.returncode != 0 or not wheel.is_file():
            raise BuildError("skypilot profile", UV, f"pip download {UV} failed ({res.returncode}); is PyPI "
                             "reachable (or PIP_INDEX_URL set to a mirror)?", res.stderr.splitlines()[-10:])
    if file_sha256(wheel).hex != UV_SHA256:
        wheel.unlink()
        raise BuildError("skypilot profile", UV, f"{UV_WHEEL} from the index does not have the pinned sha256 "
                         f"{UV_SHA256[:16]}...; removed it; check the index (PIP_INDEX_URL)", [])
    tmp = out.with_name(out.name + ".partial")
    with zipfile.ZipFile(wheel) as z, z.open(UV_MEMBER) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def stage(builder, user_ref: str, user_key: str) -> tuple[str, str]:
    """The profile's Dockerfile stage on the user stage (built when missing): its tag and key."""
    user = builder.settings.image.user
    key = key_of("skypilot-profile", user_key, template_hash("skypilot.Dockerfile.j2"), PACKAGES, UV, UV_SHA256)
    ref = f"{builder.stage_repo}:skypilot-{key[:16]}"
    if image_exists(builder.client, ref):
        return ref, key
    ctx = builder._context()
    try:
        shutil.copy2(uv_binary(builder.settings.build_dir / "profile", builder.rep), ctx / "uv")
        text = render("skypilot.Dockerfile.j2", user_ref=user_ref, packages=" ".join(PACKAGES), user=user.name,
                      uid=user.uid, gid=user.gid)
        builder._build("skypilot profile", ref, ctx, text)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return ref, key


def layers_above(client: docker.DockerClient, ref: str, lower_ref: str, store: LayerStore) -> list[layers.FileLayer]:
    """The layers of REF above those of LOWER_REF, as tars in the layer store (read once from `docker
    save REF`, each checked against its diff ID)."""
    diff_ids = [Digest(d, f"a layer of {ref}") for d in client.images.get(ref).attrs["RootFS"]["Layers"]]
    lower = client.images.get(lower_ref).attrs["RootFS"]["Layers"]
    if diff_ids[:len(lower)] != lower:
        raise BuildError("skypilot profile", ref, f"its layers do not start with those of {lower_ref}", [])
    want = diff_ids[len(lower):]
    found = {d: store.tar(d) for d in want if store.has_tar(d)}
    if len(found) < len(want):
        stream = client.api.get_image(ref)
        with _ChunkReader(stream) as raw, tarfile.open(fileobj=raw, mode="r|") as tf:
            for member in tf:
                if not (member.isfile() and member.name.endswith(".tar")):
                    continue
                tmp = store.partial("profile")
                h = hashlib.sha256()
                with tf.extractfile(member) as src, open(tmp, "wb") as dst:
                    while block := src.read(1 << 20):
                        h.update(block)
                        dst.write(block)
                d = Digest.of_hash(h)
                if d in want and d not in found:
                    found[d] = store.put_tar(tmp, d)
                else:
                    tmp.unlink()
    missing = [d for d in want if d not in found]
    if missing:
        raise BuildError("skypilot profile", ref, f"`docker save {ref}` did not hold its layer(s) "
                         f"{', '.join(d.short for d in missing)}", [])
    return [layers.FileLayer(found[d], d, found[d].stat().st_size) for d in want]


class _ChunkReader:
    """The engine's `docker save` chunks as a file object for tarfile's stream mode."""

    def __init__(self, chunks):
        self.chunks, self.buf = iter(chunks), b""

    def __enter__(self) -> "_ChunkReader":
        return self

    def __exit__(self, *exc) -> None:
        close = getattr(self.chunks, "close", None)
        if close:
            close()

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            try:
                self.buf += next(self.chunks)
            except StopIteration:
                break
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out


def add(builder, image_ref: str, human_ref: str, user_ref: str, user_key: str, rebuilt: list) -> tuple[str, str]:
    """IMAGE_REF (the finished image) plus the profile's layers, labelled as the SkyPilot profile:
    (its tag, its human tag with `-skypilot`)."""
    client, store = builder.client, builder.layer_store
    stage_ref, key = stage(builder, user_ref, user_key)
    image, named = ImageRef.parse(image_ref, "image"), ImageRef.parse(human_ref, "image")
    ref = replace(image, tag=f"{image.tag}-{SKYPILOT_PROFILE}-{key_of(image_ref, key)[:8]}").docker()
    human = replace(named, tag=f"{named.tag}-{SKYPILOT_PROFILE}").docker()
    if image_exists(client, ref):
        builder.rep.step(f"skypilot profile: reusing {ref}")
        return ref, human
    new = layers_above(client, stage_ref, user_ref, store)
    lower = client.images.get(image_ref).attrs
    config = layers.image_config(lower, [*lower["RootFS"]["Layers"], *(n.diff_id for n in new)],
                                 labels={PROFILE_LABEL: SKYPILOT_PROFILE})
    layers.load(client, new, config, ref, store)
    size = sum(n.size for n in new)
    builder.rep.step(f"skypilot profile: {ref} ({len(new)} layer(s), {size / 2**20:.1f} MiB, on top of {image_ref})")
    rebuilt.append(SKYPILOT_PROFILE)
    return ref, human

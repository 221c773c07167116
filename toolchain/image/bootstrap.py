"""Offline base image: debootstrap a minimal Debian with Python, then `docker import` it.

Nothing is pulled from a container registry. The image is tagged by the hash of its inputs
(suite, mirror, package list) and reused when that tag exists. A configured ``base_image``
(e.g. a CUDA runtime image on a real site) replaces the bootstrap entirely.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker

from runtime.imageref import ImageRef
from toolchain.config import Settings
from toolchain.docker_client import image_exists
from toolchain.errors import BootstrapError, ConfigError
from toolchain.hashing import key_of
from toolchain.progress import Reporter

BOOTSTRAP_VERSION = 1  # bump when the recipe below changes, so old bases are not reused
IMPORT_CHANGES = ["ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]']
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))


@dataclass(frozen=True)
class BaseImage:
    ref: str
    key: str
    image_id: str
    built: bool


def host_mirror() -> str:
    """The first Debian mirror in the host's apt sources (deb822 or one-line format)."""
    for src in APT_SOURCES:
        if not src.exists():
            continue
        for line in src.read_text().splitlines():
            m = re.match(r"^\s*URIs:\s*(\S+)", line) or re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s", line)
            if m and "security" not in m.group(1):
                return m.group(1)
    raise ConfigError("image.bootstrap.mirror: empty and no Debian mirror found in the host's apt sources; set it to your mirror's URL")


def bootstrap_key(settings: Settings) -> str:
    """The bootstrapped base's key: its recipe, suite, mirror (the host's, unless image.bootstrap.mirror
    names one) and packages."""
    bs = settings.image.bootstrap
    return key_of("debootstrap", BOOTSTRAP_VERSION, bs.suite, bs.mirror or host_mirror(), sorted(bs.packages))


def base_repository(settings: Settings) -> str:
    """The bootstrapped base's repository, tagged by its key's first 16 digits: in the engine, and in a
    registry (`base.publish`; `build` puts it in this tool's local registry for an image it builds there)."""
    return f"{settings.image.repository}-base"


def external_key(image_id: str) -> str:
    """A configured base image's key: its image ID (its config's digest)."""
    return key_of("external", image_id)


def ensure_base(client: docker.DockerClient, settings: Settings, rep: Reporter) -> BaseImage:
    img = settings.image
    if img.base_image:
        try:
            found = client.images.get(img.base_image)
        except docker.errors.ImageNotFound:
            raise ConfigError(
                f"image.base_image: {img.base_image!r} is not in the local engine; load or pull it first "
                "(docker load / docker pull), or set image.base_image to '' to bootstrap one"
            ) from None
        rep.step(f"base: using configured image {img.base_image} ({found.short_id})")
        return BaseImage(img.base_image, external_key(found.id), found.id, False)

    bs = img.bootstrap
    mirror = bs.mirror or host_mirror()
    key = bootstrap_key(settings)
    ref = f"{base_repository(settings)}:{key[:16]}"
    if image_exists(client, ref):
        rep.step(f"base: reusing {ref}")
        return BaseImage(ref, key, client.images.get(ref).id, False)
    if shutil.which("debootstrap") is None:
        raise BootstrapError("debootstrap is not installed; run `apt-get install debootstrap`, or set image.base_image")
    rep.step(f"base: debootstrap {bs.suite} from {mirror} (minbase + {', '.join(bs.packages)})")
    work = Path(tempfile.mkdtemp(prefix="base-", dir=settings.build_dir.as_posix() if settings.build_dir.exists() else None))
    try:
        rootfs = work / "rootfs"
        _debootstrap(bs.suite, mirror, bs.packages, rootfs, rep)
        _trim(rootfs)
        tarball = work / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        rep.step(f"base: importing {tarball.stat().st_size / 2**20:.0f} MiB as {ref}")
        named = ImageRef.parse(ref, "base image")
        client.api.import_image_from_file(str(tarball), repository=named.name, tag=named.tag, changes=IMPORT_CHANGES)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseImage(ref, key, client.images.get(ref).id, True)


def _debootstrap(suite: str, mirror: str, packages: list[str], rootfs: Path, rep: Reporter) -> None:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        if line.startswith("I: Retrieving Release") or line.startswith("I: Installing") or line.startswith("I: Base system"):
            rep.detail(line.strip())
    if proc.wait() != 0:
        raise BootstrapError(f"debootstrap of {suite} from {mirror} failed (exit {proc.returncode}):\n    " + "\n    ".join(tail))


def _trim(rootfs: Path) -> None:
    """Drop apt caches and docs that only cost space."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        d = rootfs / sub
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    for f in ("etc/machine-id",):
        (rootfs / f).unlink(missing_ok=True)

"""Small images for push tests, made here (nothing can be pulled): a runnable base imported from this
host's /bin/sh and /bin/cat with the libraries they load, and a layer assembled on top by
toolchain.image.layers (kept in a layer store, its config too, as a build keeps them)."""
from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from toolchain.image import layers

BINARIES = ("/bin/sh", "/bin/cat")


def _host_files() -> dict[str, bytes]:
    """The binaries and every library ldd names for them, by the path the loader asks for."""
    files = {}
    for binary in BINARIES:
        files[binary] = Path(binary).read_bytes()
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        for path in re.findall(r"(/\S+) \(0x", out):
            files[path] = Path(path).resolve().read_bytes()
    return files


def runnable_base(client, ref: str) -> str:
    """`docker import` of sh, cat and their libraries, tagged REF; its image ID."""
    buf = io.BytesIO()
    files = _host_files()
    dirs = sorted({str(p) for f in files for p in Path(f).parents if str(p) != "/"})
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    repository, _, tag = ref.rpartition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    return client.images.get(ref).id


def mixed_bytes(size: int, seed: int) -> bytes:
    """Binary-like content: runs of random bytes and repeats of earlier stretches (matches that
    reach back across a compression chunk's boundary)."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        if out and rng.random() < 0.5:
            start = rng.randrange(max(1, len(out) - 30000), len(out))
            out += out[start:start + rng.randrange(64, 4096)]
        else:
            out += rng.randbytes(rng.randrange(16, 2048))
    return bytes(out[:size])


@dataclass
class SmallImage:
    ref: str
    image_id: str
    base_ref: str
    base_id: str
    store: Path
    text: bytes  # what /opt/hello.txt holds

    def remove(self, client) -> None:
        for image in (self.image_id, self.base_id):
            try:
                client.images.remove(image, force=True)
            except Exception:
                pass


def small_image(client, store: Path, payload: int = 3 << 20, seed: int = 0, random_payload: bool = False) -> SmallImage:
    """The runnable base and one assembled layer (/opt/hello.txt, /opt/payload of `payload` bytes,
    binary-like or random) loaded on top, its tar and config kept in STORE. Unique tags; `remove`
    deletes both images."""
    name = uuid.uuid4().hex[:8]
    base_ref = f"raytrain-pushtest-base:{name}"
    base_id = runnable_base(client, base_ref)
    lower = client.images.get(base_id).attrs
    text = f"hello from {name}\n".encode()
    data = os.urandom(payload) if random_payload else mixed_bytes(payload, seed)
    layer = layers.make_layer([("opt/hello.txt", text, False), ("opt/payload", data, False)])
    config = layers.image_config(lower, [*lower["RootFS"]["Layers"], layer.diff_id])
    ref = f"raytrain-pushtest:{name}"
    image_id = layers.load(client, [layer], config, ref, store)
    return SmallImage(ref, image_id, base_ref, base_id, store, text)


def build_record(image: SmallImage, spec_sha256: str, variant: str = "cpu") -> dict:
    """A build.json entry for the image, as `invoke build` records one (its human tag made here too)."""
    return {"variant": variant, "local_ref": image.ref, "human_ref": f"{image.ref.split(':')[0]}:{variant}-latest-test",
            "image_id": image.image_id, "spec_sha256": spec_sha256, "base_ref": image.base_ref, "deps_ref": "-",
            "app_ref": "-", "torch_source": "-"}


def write_build(build_dir: Path, records: dict) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "build.json").write_text(json.dumps(records))


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PlainRegistry:
    """Debian's docker-registry on a free loopback port, data in WORKDIR; stop() ends it."""

    def __init__(self, workdir: Path):
        import shutil
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{free_port()}"
        (self.dir / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.dir / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n" + self.auth_config())
        binary = shutil.which("docker-registry") or shutil.which("registry")
        self.proc = subprocess.Popen([binary, "serve", str(self.dir / "config.yml")], stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir / "registry.log", "wb"), stdin=subprocess.DEVNULL)
        from deploy.registry.address import ping
        from runtime.wait import wait_until
        wait_until(lambda: ping(self.address, 0.5), timeout_s=30, what=f"docker-registry on {self.address}",
                   logs=lambda: (self.dir / "registry.log").read_text(errors="replace")[-2000:])

    def auth_config(self) -> str:
        """Extra registry configuration (an `auth:` section); none here."""
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def cleanup_pulled(client, address: str) -> None:
    """Remove every local image pulled from ADDRESS (pulls by digest leave repo digests, not tags)."""
    for image in client.images.list():
        if any(d.startswith(address + "/") for d in image.attrs.get("RepoDigests") or []) or \
           any(t.startswith(address + "/") for t in image.tags):
            try:
                client.images.remove(image.id, force=True)
            except Exception:
                pass


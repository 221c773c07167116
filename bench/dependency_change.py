"""What a dependency change moves: the per-wheel dependency layers against the single layer of before, in one run.

From a built and pushed image of a scratch copy of the example, two requirement changes:
  (a) one small pure-Python wheel added (six);
  (b) one mid-size wheel at another version (numpy 2.4.6 -> 2.4.5).
For each, and for the image before them:
  new   `pipeline.build` and `pipeline.push` of the scratch project with the changed requirements (the
        wheelhouse's pip resolution and download is timed apart: it is the same for both ways);
  old   the same wheel set as ONE dependency layer, every wheel and its bytecode in one tar (the layout before
        per-wheel layers), written, loaded on the same user stage under the venv's top layer, and pushed with the
        same push code to another repository. Its write and load run one after the other here; the old build
        overlapped them (its cold-path figure was 65-67 s), so its build time here is an upper bound;
  pull  new: a containerd that holds the image before the change fetches the new one (`ctr content fetch` in
        a namespace of the bench's own): the bytes it fetched, from the registry's access log. old: what
        such a containerd fetches, computed from the two manifests (the blobs the image after has that the one
        before lacks: its one dependency layer), not fetched: fetching 4 GiB per step would need 12 GiB more
        disk and say nothing the manifests do not. What the Docker engine fetches is computed from its rule
        (it fetches again every layer above the first one that changed: its layer store chains them) and
        printed beside both.
The registry is the bench's own (a free loopback port, data under the scratch directory, info-level access log);
everything the bench made (images, registry, containerd namespace, files) is removed at the end.
Preconditions: the project is built (the README's main command): its stages are the image before the changes.
Needs about 42 GB free (the old way's 7 GB layer is in its tar, the engine and compressed at once). Run: .venv/bin/python bench/dependency_change.py   (15-25 minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import SPEC, make_settings  # noqa: E402
from runtime.contract import VENV  # noqa: E402
from toolchain.image import bytecode, layers, venv_layer, venv_plan
from toolchain import cache, pipeline  # noqa: E402
from toolchain.docker_client import engine  # noqa: E402
from toolchain.progress import Reporter, human_bytes  # noqa: E402
from toolchain.publish.push import push_image  # noqa: E402
from toolchain.records import read_builds  # noqa: E402
from toolchain.wheels.wheelhouse import ensure_wheelhouse  # noqa: E402

NEED_FREE = 42 << 30
NS = "raytrain-bench"
IMAGES = "bench-depchange"  # the scratch project's image names (<IMAGES>-cpu); its stages are the project's
# containerd's socket: its own service's, or the one dockerd starts (Debian's docker.io)
SOCKET = next((s for s in ("/run/containerd/containerd.sock", "/run/docker/containerd/containerd.sock")
               if Path(s).is_socket()), "/run/containerd/containerd.sock")
CTR = ["ctr", "--address", SOCKET, "-n", NS]
CHANGES = {"(a) add six": ("add", "six==1.17.0"), "(b) numpy 2.4.5": ("replace", "numpy==2.4.5")}


class Registry:
    """Debian's docker-registry with an info-level access log: the bytes each GET of a blob sent."""

    def __init__(self, workdir: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address, self.dir = f"127.0.0.1:{port}", workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: info\n  formatter: text\n"
            f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\nhttp:\n  addr: {self.address}\n")
        self.log = workdir / "registry.log"
        self.proc = subprocess.Popen([shutil.which("docker-registry") or "registry", "serve", str(workdir / "config.yml")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), stdin=subprocess.DEVNULL)
        from runtime.wait import wait_until
        from deploy.registry.address import ping
        wait_until(lambda: ping(self.address, 0.5), timeout_s=30, what=f"docker-registry on {self.address}")

    def blob_bytes_since(self, offset: int) -> tuple[int, int]:
        """(bytes sent for blob GETs since OFFSET in the log, the log's size now)."""
        data = self.log.read_bytes()
        total = 0
        for line in data[offset:].decode(errors="replace").splitlines():
            if 'msg="response completed"' in line and "http.request.method=GET" in line and "/blobs/sha256:" in line:
                m = re.search(r"http\.response\.written=(\d+)", line)
                total += int(m[1]) if m else 0
        return total, len(data)

    def drop_blobs(self, digests: set[str]) -> None:
        """Delete blobs from the registry's storage (the bench's own registry, files under its data dir):
        the old way's 4 GiB layers once nothing reads them again."""
        for digest in digests:
            algo, hexa = digest.split(":")
            shutil.rmtree(self.dir / "data" / "docker" / "registry" / "v2" / "blobs" / algo / hexa[:2] / hexa,
                          ignore_errors=True)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def fetch(reg: Registry, ref: str) -> int:
    """containerd fetches REF into the bench's namespace; the blob bytes the registry sent for it."""
    _, start = reg.blob_bytes_since(0)
    subprocess.run([*CTR, "content", "fetch", "--plain-http", ref], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sent, _ = reg.blob_bytes_since(start)
    return sent


def missing(before: list[tuple[str, int]], after: list[tuple[str, int]]) -> int:
    """The blob bytes a content-addressed puller (containerd) holding BEFORE fetches for AFTER."""
    held = {digest for digest, _ in before}
    return sum(size for digest, size in after if digest not in held)


def docker_rule(before: list[tuple[str, int]], after: list[tuple[str, int]]) -> int:
    """The blob bytes a Docker engine holding BEFORE fetches for AFTER ((digest, size) bottom first): every
    layer from the first that differs upward (the config is not counted)."""
    same = 0
    while same < min(len(before), len(after)) and before[same][0] == after[same][0]:
        same += 1
    return sum(size for _, size in after[same:])


def manifest_layers(reg: Registry, repo: str, tag: str) -> list[tuple[str, int]]:
    import requests
    r = requests.get(f"http://{reg.address}/v2/{repo}/manifests/{tag}",
                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=30)
    r.raise_for_status()
    return [(layer["digest"], layer["size"]) for layer in r.json()["layers"]]


def requirements_for(change: str | None, work: Path) -> list[str]:
    """The project's requirement files, with CHANGE applied in copies."""
    files = [ROOT / "runtime" / "requirements.txt", ROOT / "examples" / "train" / "requirements.txt"]
    if change is None:
        return [str(f) for f in files]
    how, line = CHANGES[change]
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        text = f.read_text()
        if how == "replace":
            name = line.split("==")[0]
            text = re.sub(rf"(?m)^{re.escape(name)}==\S+$", line, text)
        copy = work / f"{f.parent.name}-{f.name}"
        copy.write_text(text)
        out.append(str(copy))
    if how == "add":
        (work / "added.txt").write_text(line + "\n")
        out.append(str(work / "added.txt"))
    return out


made: list[str] = []  # the old way's images, removed at the end whatever happened


def old_way(client, settings, user_ref: str, reg: Registry, repo: str, tag: str, scratch: Path, rep: Reporter) -> dict:
    """The wheel set as one layer (the layout before per-wheel layers), loaded and pushed; its figures."""
    py = client.containers.run(read_builds(settings.build_dir)["cpu"].base_ref.docker(),
                               ["python3", "-c", venv_layer.Python.PROBE], remove=True).decode()
    python = venv_layer.Python.parse(py, "base")
    wh = ensure_wheelhouse(settings, "cpu", python.minor, Reporter(quiet=True))
    wheels = venv_layer.wheels_of(wh.files, python.minor)
    store = scratch / "old-store"
    t0 = time.monotonic()
    compiler = bytecode.HostCompiler(planned=venv_layer.planned_modules(wheels, python, VENV))
    try:
        writer = venv_layer.LayerWriter(wheels, python, VENV, store, compiler.planned_of(wheels))
        writer.files()
        layer = writer.finish(compiler.of(wheels), python.cache_tag)
    finally:
        compiler.close()
    top = venv_layer.top_layer(python, VENV, writer.out.scripts)
    user = client.images.get(user_ref).attrs
    config = layers.image_config(user, [*user["RootFS"]["Layers"], layer.diff_id, top.diff_id])
    image_id = layers.load(client, [layer, top], config, f"bench-old:{tag}", store)
    made.append(image_id)
    build_s = time.monotonic() - t0
    res = push_image(client, "cpu", image_id, f"{reg.address}/{repo}", [tag], 0, 0.2, Reporter(quiet=True), 300,
                     layer_store=store, blob_cache=scratch / "old-blobs", candidates=[user_ref])
    # 7 GB each, in the layer store, the blob cache and the engine: each old step makes its own
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(scratch / "old-blobs", ignore_errors=True)
    client.images.remove(image_id, force=True)  # its tag and the digest the push resolved
    return {"build_s": build_s, "uploaded": res.bytes_uploaded, "blobs": res.layers_pushed, "push_s": res.seconds}


def scratch_spec(scratch: Path) -> Path:
    """The example's spec with image names of the bench's own, so that its images never take (or reuse) a
    tag of the project's raytrain-cpu; its stages are the project's (image.repository), so the image
    before the changes is the project's built one, and its layers are not held twice by the engine."""
    spec = json.loads(SPEC.read_text())
    spec.update(cpu_image=f"{IMAGES}-cpu", gpu_image=f"{IMAGES}-gpu")
    path = scratch / "spec.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


def new_way(settings, spec: Path, tag: str, rep: Reporter) -> dict:
    t0 = time.monotonic()
    ensure_wheelhouse(settings, "cpu", "3.11", rep)
    wheelhouse_s = time.monotonic() - t0
    t0 = time.monotonic()
    pipeline.build(settings, str(spec), "cpu", rep)
    build_s = time.monotonic() - t0
    res = pipeline.push(settings, str(spec), "cpu", rep)["images"]["cpu"]["push"]
    return {"wheelhouse_s": wheelhouse_s, "build_s": build_s, "uploaded": res["bytes_uploaded"],
            "blobs": res["layers_pushed"], "push_s": res["seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (for a look at the registry log)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-depchange-", dir=ROOT / "build"))
    # the bench's own caches (layer index, blob digests and homes): it leaves nothing of its own behind. The
    # layer index starts as the project's (what its build left), since the image before the changes is the
    # project's: without it every layer is written again to learn its diff ID (7 GB, 45 s, seen)
    user_index = venv_plan.default_index()
    os.environ[cache.ENV] = str(scratch / "cache")
    if user_index.is_dir():
        shutil.copytree(user_index, venv_plan.default_index())
    if shutil.disk_usage(scratch).free < NEED_FREE:
        print(f"need {human_bytes(NEED_FREE)} free under {scratch}", file=sys.stderr)
        return 2
    client = engine()
    rep = Reporter()
    reg = Registry(scratch / "registry")
    app = scratch / "app"
    shutil.copytree(ROOT / "examples" / "train", app)
    load = os.getloadavg()[0]
    rows = {}
    tags_before = {t for img in client.images.list() for t in img.tags}
    settings = make_settings(scratch / "work", app, reg.address, ROOT / "runtime")
    try:
        print(f"bench: {os.cpu_count()} cores, load {load:.1f} at the start; registry {reg.address}")
        settings.project.requirements = requirements_for(None, scratch)
        spec = scratch_spec(scratch)
        new = new_way(settings, spec, "before", rep)  # the project's stages, reused: its final image and push only
        user_ref = read_builds(settings.build_dir)["cpu"].user_ref.docker()
        old = old_way(client, settings, user_ref, reg, "bench-old", "before", scratch, rep)
        repo_new = read_builds(settings.build_dir)["cpu"].local_ref.name
        before_new = manifest_layers(reg, repo_new, "cpu-latest")
        before_old = manifest_layers(reg, "bench-old", "before")
        fetch(reg, f"{reg.address}/{repo_new}:cpu-latest")
        rows["before"] = {"new": new, "old": old}
        for name in CHANGES:
            settings.project.requirements = requirements_for(name, scratch / hashlib.sha256(name.encode()).hexdigest()[:8])
            tag = "change-" + name[1]
            new = new_way(settings, spec, tag, rep)
            new["pulled"] = fetch(reg, f"{reg.address}/{repo_new}:cpu-latest")
            after_new = manifest_layers(reg, repo_new, "cpu-latest")
            new["docker_pull"] = docker_rule(before_new, after_new)
            old = old_way(client, settings, user_ref, reg, "bench-old", tag, scratch, rep)
            after_old = manifest_layers(reg, "bench-old", tag)
            old["pulled"] = missing(before_old, after_old)  # computed, not fetched (see the top)
            # read by nothing from now on (a blob the per-wheel images also have stays)
            reg.drop_blobs({d for d, _ in before_old} - {d for d, _ in after_old + before_new + after_new})
            old["docker_pull"] = docker_rule(before_old, after_old)
            before_new, before_old = after_new, after_old
            rows[name] = {"new": new, "old": old}
    finally:
        reg.stop()
        made.extend(t for img in client.images.list() for t in img.tags  # the stages and images it added
                    if t not in tags_before and t.split(":")[0] in (f"{settings.image.repository}-stages", f"{IMAGES}-cpu"))
        for image_id in made:
            try:
                client.images.remove(image_id, force=True)
            except Exception:  # noqa: BLE001 - removed already
                pass
        for img in client.images.list():  # the references the pulls through the bench's registry left
            for ref in img.attrs.get("RepoDigests") or []:
                if ref.startswith(f"{reg.address}/"):
                    client.images.remove(ref)  # the reference; the image too once nothing names it
        for line in subprocess.run([*CTR, "content", "ls", "-q"], capture_output=True, text=True).stdout.split():
            subprocess.run([*CTR, "content", "rm", line], capture_output=True)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print("\nchange            way  build      uploaded (blobs)   push     containerd pulled   docker engine pulls (rule)"
          "\n(containerd pulled: new fetched by containerd, bytes from the registry's log; old computed from the manifests)")
    for name, row in rows.items():
        for way in ("new", "old"):
            r = row[way]
            print(f"{name:<17} {way:<4} {r['build_s']:6.1f}s   {human_bytes(r['uploaded']):>10} ({r['blobs']:>2})   "
                  f"{r['push_s']:6.1f}s   {human_bytes(r.get('pulled', 0)):>12}       {human_bytes(r.get('docker_pull', 0)):>10}")
        if name != "before":
            n, o = row["new"], row["old"]
            print(f"{'':<17} old/new: build {o['build_s'] / max(n['build_s'], 1e-3):.1f}x, uploaded "
                  f"{o['uploaded'] / max(n['uploaded'], 1):.0f}x, push {o['push_s'] / max(n['push_s'], 1e-3):.1f}x, "
                  f"pulled {o['pulled'] / max(n['pulled'], 1):.0f}x; the new way's wheelhouse step {n['wheelhouse_s']:.1f}s")
    print(f"bench: load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

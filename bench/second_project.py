"""A second project on the same machine: what it downloads and how long its build takes, beside the first's.

Two projects made by `raytrain init` in scratch directories, built one after the other with the
installed `raytrain` (cpu variant), sharing one user cache that starts empty:
  first    the example (`raytrain init --example`): every wheel downloaded, every layer written;
  second   a different project (a Ray driver needing `tabulate`): the same torch, Ray and CUDA wheels.
For each: the build's wall time, the bytes the wheel pool grew by (what was downloaded as wheels), the
bytes this host received on its network interfaces meanwhile (resolution included; anything else the
host did too), and the dependency layers written. Then: do the two share every torch layer, and did the
second build change a tag of the first? Prints the ratios second/first.

Its images are named bench2p-* (stages and base under image.repository bench2p) and are removed at the
end, with the scratch directory and cache. Needs the engine, debootstrap, PyPI and about 25 GB free.

    .venv/bin/python bench/second_project.py
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolchain.docker_client import engine  # noqa: E402
from toolchain.progress import human_bytes  # noqa: E402

PREFIX = "bench2p"
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
NEED_FREE = 25 << 30
SECOND_DRIVER = '''import json, ray, tabulate
ray.init()
print("SUMMARY " + json.dumps({"nodes": len(ray.nodes()), "t": tabulate.tabulate([[1]])}))
'''


def received() -> int:
    """Bytes received on every interface of this host but loopback."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() != "lo":
            total += int(data.split()[0])
    return total


def pool_bytes(cache: Path) -> int:
    pool = cache / "wheels"
    return sum(f.stat().st_size for f in pool.glob("*.whl")) if pool.is_dir() else 0


def build(project: Path, env: dict) -> dict:
    cache = Path(env["RAYTRAIN_CACHE"])
    before_pool, before_rx, t0 = pool_bytes(cache), received(), time.monotonic()
    res = subprocess.run([RAYTRAIN, "build", "--variant", "cpu", "--json", "--quiet"], cwd=project, env=env,
                         capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"build of {project.name} failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout)["images"]["cpu"]
    return {"seconds": seconds, "wheels_downloaded": pool_bytes(cache) - before_pool,
            "received": received() - before_rx, "rebuilt": out["rebuilt"], "record": out}


def layers_of(client, ref: str) -> list[str]:
    return client.images.get(ref).attrs["RootFS"]["Layers"]


def main() -> int:
    scratch = Path(tempfile.mkdtemp(prefix="bench-second-project-"))
    if shutil.disk_usage(scratch).free < NEED_FREE:
        print(f"need {human_bytes(NEED_FREE)} free under {scratch}", file=sys.stderr)
        return 2
    client = engine()
    env = {**os.environ, "RAYTRAIN_CACHE": str(scratch / "cache"), "INVOKE_IMAGE_REPOSITORY": PREFIX}
    first, second = scratch / f"{PREFIX}-first", scratch / f"{PREFIX}-second"
    first.mkdir()
    second.mkdir()
    (second / "train.py").write_text(SECOND_DRIVER)
    (second / "requirements.txt").write_text("tabulate==0.9.0\n")
    try:
        for d, args in ((first, ["init", "--example"]), (second, ["init"])):
            subprocess.run([RAYTRAIN, *args], cwd=d, env=env, check=True, capture_output=True)
        print(f"bench: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start, an empty user cache",
              flush=True)
        a = build(first, env)
        tags_before = {t: client.images.get(t).id for t in client.images.get(a["record"]["local_ref"]).tags}
        b = build(second, env)
        tags_after = {t: client.images.get(t).id for t in tags_before}
        la, lb = layers_of(client, a["record"]["deps_ref"]), layers_of(client, b["record"]["deps_ref"])
        shared = len(set(la) & set(lb))
        print(f"{'':8} {'build':>8} {'wheels downloaded':>18} {'received':>10}  rebuilt")
        for name, r in (("first", a), ("second", b)):
            print(f"{name:8} {r['seconds']:7.1f}s {human_bytes(r['wheels_downloaded']):>18} "
                  f"{human_bytes(r['received']):>10}  {', '.join(r['rebuilt'])}")
        print(f"ratio second/first: build {b['seconds'] / a['seconds']:.3f}, wheels downloaded "
              f"{b['wheels_downloaded'] / max(a['wheels_downloaded'], 1):.4f}, received "
              f"{b['received'] / max(a['received'], 1):.4f}")
        print(f"dependency layers: first {len(la)}, second {len(lb)}, shared {shared} (same diff IDs); the second's "
              f"own: {len(set(lb) - set(la))}")
        print(f"the first project's tags unchanged by the second's build: {tags_before == tags_after} "
              f"({', '.join(sorted(tags_before))})")
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        return 0 if tags_before == tags_after and shared >= len(la) - 3 else 1
    finally:
        for image in client.images.list():
            for tag in image.tags:
                if re.match(rf"({PREFIX}|127\.0\.0\.1:\d+/{PREFIX})", tag):
                    try:
                        client.images.remove(tag, force=True)
                    except Exception:  # noqa: BLE001 - gone already
                        pass
        client.images.prune(filters={"dangling": True})
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

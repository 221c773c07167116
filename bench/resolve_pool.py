"""A resolution on a warm machine: the example's requirement set resolved by uv for the image, with the user's
wheel pool (run the README's main command first: it fills the pool with the whole set, 3.9 GiB) given to uv

  baseline: as its directory (`--find-links <pool>`): uv reads every wheel in it to hash it for the lock;
  ours:     as its page of links, each with the sha256 recorded when the wheel was checked
            (toolchain/wheels/pool_page.py): uv reads no wheel.

Each way twice: after the page cache is dropped (as after a reboot or on a busy machine; needs root, else
only warm), and again at once. The same uv, cache and requirements in both, one process each time; the locks
are compared. Run: .venv/bin/python bench/resolve_pool.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolchain import cache  # noqa: E402
from toolchain.wheels import pool_page, resolver  # noqa: E402
from toolchain.wheels.requirements import uv_binary  # noqa: E402


def requirements(pool: Path) -> list[str]:
    """The example's and the runtime's requirements, and torch pinned to the pool's (as the build pins it)."""
    lines = []
    for f in (ROOT / "examples" / "train" / "requirements.txt", ROOT / "runtime" / "requirements.txt"):
        lines += [l.strip() for l in f.read_text().splitlines() if l.strip() and not l.startswith("#")]
    (torch,) = {w.name.split("-")[1] for w in pool.glob("torch-*.whl")} or {None}
    if torch is None:
        sys.exit(f"{pool} holds no torch wheel: run the README's main command first")
    return lines + [f"torch=={torch}"]


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def resolve(find_links: str, reqs: list[str]) -> tuple[float, str]:
    cmd = [uv_binary(), "pip", "compile", "-", "--python-version", "3.11", "--python-platform", resolver.platform(),
           "--no-header", "--format", "pylock.toml", "--quiet", "--cache-dir", str(cache.writable(cache.UV)),
           "--find-links", find_links]
    t0 = time.monotonic()
    res = subprocess.run(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True, check=True)
    return time.monotonic() - t0, res.stdout


def main() -> None:
    pool = cache.part(cache.WHEELS)
    wheels = list(pool.glob("*.whl"))
    if len(wheels) < 20:
        sys.exit(f"{pool} holds {len(wheels)} wheels: run the README's main command first")
    size = sum(w.stat().st_size for w in wheels)
    reqs = requirements(pool)
    resolve(str(pool), reqs)  # uv's cache warm for both ways, the pool's record made
    with tempfile.TemporaryDirectory() as tmp:
        page = str(pool_page.page(pool, Path(tmp) / "pool.html"))
        rows, locks = [], {}
        for name, links in (("baseline: the pool's directory", str(pool)), ("ours: the pool's page", page)):
            for when in ("page cache dropped", "again at once"):
                if when == "page cache dropped" and not drop_caches():
                    continue
                seconds, locks[name] = resolve(links, reqs)
                rows.append((name, when, seconds))
    same = locks["baseline: the pool's directory"] == locks["ours: the pool's page"]
    print(f"{len(reqs)} requirements, a pool of {len(wheels)} wheels ({size / (1 << 30):.1f} GiB); load "
          f"{os.getloadavg()[0]:.1f}; the two locks {'are the same' if same else 'DIFFER'}")
    print("| way | when | seconds |\n| --- | --- | --- |")
    for name, when, seconds in rows:
        print(f"| {name} | {when} | {seconds:.2f} |")
    base = {w: s for n, w, s in rows if n.startswith("baseline")}
    for name, when, seconds in rows:
        if name.startswith("ours"):
            print(f"ratio ours / baseline, {when}: {seconds / base[when]:.3f}")


if __name__ == "__main__":
    main()

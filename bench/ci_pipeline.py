"""A CI image pipeline's dependency change: `raytrain build push` after one small wheel is added, on a runner
with no Docker engine (DOCKER_HOST pointing at nothing), against the registry holding the previous image.

  (b) a fresh runner: an empty HOME and user cache;
  (c) a warm runner: the same, a second small wheel added, its cache kept from (b);
  baseline, same run: the same change built and pushed by this tool with the engine and the same empty
      cache (every wheel downloaded, every layer written, loaded and compressed), as a fresh runner
      with an engine did before;
The peer (a plain Dockerfile's `pip install -r`, built by the engine's builder and sent by `docker push`)
is not run here; its figure in docs/benchmarks.md is from another run, with its conditions.

It first pushes this checkout's last cpu build (build/build.json: run the README's main command first) to
the bench's own registry (127.0.0.1:5059, removed at the end). Each case runs the CLI in a copy of this
checkout, and reports its time, the bytes of wheels downloaded and the bytes uploaded.
Run: .venv/bin/python bench/ci_pipeline.py   (about 5 minutes; the baseline downloads the whole wheel set)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import forget_pulls, make_settings  # noqa: E402
from toolchain import cache  # noqa: E402
from toolchain.progress import human_bytes  # noqa: E402
from toolchain.publish.local_registry import start_local, stop_local  # noqa: E402
from toolchain.progress import Reporter  # noqa: E402

REGISTRY = "127.0.0.1:5059"
CLI = [sys.executable, "-m", "toolchain.cli"]


def checkout_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shutil.copytree(ROOT / ".git", dest / ".git")  # the revision label: the previous image's
    return dest


def run_case(project: Path, env: dict, added: str) -> dict:
    with open(project / "examples" / "train" / "requirements.txt", "a") as f:
        f.write(f"{added}\n")
    pool = Path(env[cache.ENV]) / cache.WHEELS
    before = sum(f.stat().st_size for f in pool.glob("*.whl"))
    t0 = time.monotonic()
    out = ""
    for task in (["build", "--variant", "cpu"], ["push", "--variant", "cpu", "--json"]):
        res = subprocess.run([*CLI, *task], cwd=project, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{' '.join(task)} failed:\n{res.stderr[-3000:]}")
        out = res.stdout
    seconds = time.monotonic() - t0
    push = json.loads(out)["images"]["cpu"]["push"]
    return {"seconds": seconds, "downloaded": sum(f.stat().st_size for f in pool.glob("*.whl")) - before,
            "uploaded": push["bytes_uploaded"], "layers": push["layers_pushed"]}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not (ROOT / "build" / "build.json").is_file():
        sys.exit("no build in build/build.json: run the README's main command first")
    work = Path(tempfile.mkdtemp(prefix="bench-ci-"))
    settings = make_settings(work / "w", ROOT / "examples" / "train", registry_address=REGISTRY)
    start_local(settings, Reporter(quiet=True))
    load = os.getloadavg()[0]
    rows = []
    try:
        base_env = {**os.environ, "INVOKE_REGISTRY_ADDRESS": REGISTRY,
                    "INVOKE_REGISTRY_DATA_DIR": str(work / "registry-data")}
        seed = checkout_copy(work / "seed")  # this checkout's build, pushed from a copy: its records stay its own
        (seed / "build").mkdir()
        shutil.copy2(ROOT / "build" / "build.json", seed / "build" / "build.json")
        shutil.copytree(ROOT / "build" / "layers", seed / "build" / "layers")
        subprocess.run(["cp", "-al", str(ROOT / "build" / "blobs"), str(seed / "build" / "blobs")], check=True)
        subprocess.run([*CLI, "push", "--variant", "cpu"], cwd=seed, env=base_env, check=True, capture_output=True)
        fresh = checkout_copy(work / "fresh")
        (work / "home").mkdir()
        no_engine = {**base_env, "DOCKER_HOST": f"unix://{work}/no-engine.sock", "HOME": str(work / "home"),
                     cache.ENV: str(work / "cache-ci")}
        rows.append(("(b) fresh runner, no engine, `six` added", run_case(fresh, no_engine, "six==1.17.0")))
        rows.append(("(c) warm runner, no engine, `tabulate` added", run_case(fresh, no_engine, "tabulate==0.9.0")))
        # its own human tag: the engine's raytrain-cpu:cpu-latest stays this checkout's
        engine_env = {**base_env, cache.ENV: str(work / "cache-engine"), "INVOKE_IMAGE_HUMAN_TAG": "bench-ci"}
        rows.append(("baseline: fresh runner with the engine, `six` added",
                     run_case(checkout_copy(work / "engine"), engine_env, "six==1.17.0")))
    finally:
        stop_local(settings)
        forget_pulls(REGISTRY)
        for made in (work / "engine" / "build" / "build.json",):
            if made.is_file():
                for rec in json.loads(made.read_text()).values():
                    subprocess.run(["docker", "rmi", rec["human_ref"], rec["local_ref"]], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"CI pipeline, one small wheel added (load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    print("| case | seconds | wheels downloaded | uploaded (layers) |")
    print("| --- | --- | --- | --- |")
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.1f} | {human_bytes(r['downloaded'])} | {human_bytes(r['uploaded'])} "
              f"({r['layers']}) |")
    print(f"ratio (b) / baseline: {rows[0][1]['seconds'] / rows[2][1]['seconds']:.3f}")


if __name__ == "__main__":
    main()

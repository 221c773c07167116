"""A CI image pipeline: `raytrain build push` of the cpu image on a runner with no Docker engine
(DOCKER_HOST pointing at nothing), then one small wheel added, against the registry holding the image.

  (a) a fresh runner, cold registry: an empty HOME and user cache, no image of the project in the
      registry, only the base (`raytrain base.publish`), pinned as image.base_image: every wheel downloaded;
  (b) a fresh runner: an empty HOME and user cache, one small wheel added to the image the registry holds;
  (c) a warm runner: the same, a second small wheel added, its cache kept from (b);
  (e) a fresh runner whose engine holds no stage of the project (a hosted runner's: the engine answers):
      an empty HOME and user cache, a third small wheel added; the engine is not used (toolchain/image/way.py);
  baseline, same run: (b)'s change built and pushed by this tool in the engine (`build --load`) with an empty
      cache (every wheel downloaded, every layer written, loaded and compressed), as a fresh runner with an
      engine did before `way.py`;
  (d) with --peer: the peer, a plain Dockerfile (`FROM` the base, `pip install` of the same pinned
      requirements) built by the engine's builder and sent by `docker push`, once, then again with
      `six` added (the engine here has no buildx; its classic builder reruns the whole `pip install`
      step). About 25 more minutes.

It pushes this checkout's last cpu build (build/build.json: run the README's main command first) to
the bench's own registry (127.0.0.1:5059, removed at the end) after (a), for (b) and (c). Each case runs
the CLI in a copy of this checkout and reports its time, the bytes of wheels downloaded and the bytes
uploaded. Run: .venv/bin/python bench/ci_pipeline.py [--peer]   (about 10 minutes: (a) and the
baseline download the whole wheel set)
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


def run_case(project: Path, env: dict, added: str, load: bool = False) -> dict:
    if added:
        with open(project / "examples" / "train" / "requirements.txt", "a") as f:
            f.write(f"{added}\n")
    pool = Path(env[cache.ENV]) / cache.WHEELS
    before = sum(f.stat().st_size for f in pool.glob("*.whl"))
    t0 = time.monotonic()
    # one invocation, as docs/ci.md's jobs run it: build's summary, then push's, on stdout
    res = subprocess.run([*CLI, "build", "--variant", "cpu", "--json", *(["--load"] if load else []),
                          "push", "--variant", "cpu", "--json"],
                         cwd=project, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"build push failed:\n{res.stderr[-3000:]}")
    out = res.stdout.strip()
    _, build_end = json.JSONDecoder().raw_decode(out)
    push = json.loads(out[build_end:])["images"]["cpu"]["push"]
    return {"seconds": seconds, "downloaded": sum(f.stat().st_size for f in pool.glob("*.whl")) - before,
            "uploaded": push["bytes_uploaded"], "layers": push["layers_pushed"]}


PEER_DOCKERFILE = """FROM {base}
RUN python3 -m venv /opt/venv
COPY requirements.txt ca.crt /tmp/
RUN PIP_CERT=/tmp/ca.crt /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY examples/train /app/project
"""
# the certificates this host's pip trusts (an index behind a TLS-inspecting proxy), given to the build's pip
HOST_CA = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"


def peer_case(project: Path, base: str, pins: list[str], added: str, tag: str) -> dict:
    """(d): the Dockerfile above, built by the engine's builder and pushed by `docker push`."""
    (project / "requirements.txt").write_text("\n".join(pins + ([added] if added else [])) + "\n")
    (project / "Dockerfile").write_text(PEER_DOCKERFILE.format(base=base))
    shutil.copyfile(HOST_CA, project / "ca.crt")
    t0 = time.monotonic()
    res = subprocess.run(["docker", "build", "-q", "-t", tag, "."], cwd=project, capture_output=True, text=True,
                         env={**os.environ, "DOCKER_BUILDKIT": "0"})
    if res.returncode != 0:
        sys.exit(f"the peer's docker build failed:\n{(res.stdout + res.stderr)[-3000:]}")
    built = time.monotonic() - t0
    pushed = subprocess.run(["docker", "push", tag], capture_output=True, text=True, check=True).stdout
    sizes = json.loads(subprocess.run(["docker", "inspect", "--format", "{{json .RootFS.Layers}}", tag],
                                      capture_output=True, text=True, check=True).stdout)
    return {"seconds": time.monotonic() - t0, "build_seconds": built, "downloaded": -1, "uploaded": -1,
            "layers": sum(1 for line in pushed.splitlines() if line.endswith(": Pushed")), "all_layers": len(sizes)}


def image_pins(project: Path) -> list[str]:
    """name==version of every wheel the image of PROJECT's last build recorded (its provenance)."""
    from packaging.utils import parse_wheel_filename
    from toolchain.image import provenance
    rec = json.loads((project / "build" / "build.json").read_text())["cpu"]
    config = json.loads((project / "build" / "layers" / f"{rec['image_id'].split(':')[1]}.json").read_text())
    made = provenance.parse(config[provenance.FIELD])
    return sorted({"{}=={}".format(*parse_wheel_filename(w.file)[:2]) for w in made.wheels})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", action="store_true", help="also run (d), the plain Dockerfile (about 25 minutes)")
    peer = parser.parse_args().peer
    if not (ROOT / "build" / "build.json").is_file():
        sys.exit("no build in build/build.json: run the README's main command first")
    work = Path(tempfile.mkdtemp(prefix="bench-ci-"))
    settings = make_settings(work / "w", ROOT / "examples" / "train", registry_address=REGISTRY)
    start_local(settings, Reporter(quiet=True))
    load = os.getloadavg()[0]
    rows = []

    def record(row: tuple) -> None:  # each case as it ends, too: a run stopped in (d) keeps the others
        rows.append(row)
        print(f"{row[0]}: {json.dumps(row[1])}", flush=True)
    try:
        base_env = {**os.environ, "INVOKE_REGISTRY_ADDRESS": REGISTRY,
                    "INVOKE_REGISTRY_DATA_DIR": str(work / "registry-data")}
        # (a): the base pushed once (as a machine with an engine would), then a runner with nothing
        base = subprocess.run([*CLI, "base.publish", "--to", f"{REGISTRY}/raytrain-base"], cwd=ROOT, env=base_env,
                              check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        (work / "home-a").mkdir()
        first = checkout_copy(work / "first")
        record(("(a) fresh runner, no engine, cold registry", run_case(first, {
            **base_env, "DOCKER_HOST": f"unix://{work}/no-engine.sock", "HOME": str(work / "home-a"),
            cache.ENV: str(work / "cache-a"), "INVOKE_IMAGE_BASE_IMAGE": base}, "")))
        pins = image_pins(first)
        shutil.rmtree(work / "cache-a", ignore_errors=True)
        shutil.rmtree(first / "build", ignore_errors=True)
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
        record(("(b) fresh runner, no engine, `six` added", run_case(fresh, no_engine, "six==1.17.0")))
        record(("(c) warm runner, no engine, `tabulate` added", run_case(fresh, no_engine, "tabulate==0.9.0")))
        # an engine that holds no stage of the project (a hosted runner's): not used, as if there were none
        (work / "home-e").mkdir()
        record(("(e) fresh runner, a fresh engine, `toolz` added", run_case(checkout_copy(work / "fresh-engine"), {
            **base_env, "HOME": str(work / "home-e"), cache.ENV: str(work / "cache-e"),
            "INVOKE_IMAGE_REPOSITORY": "bench-ci-fresh-engine"}, "six==1.17.0\ntabulate==0.9.0\ntoolz==1.0.0")))
        # its own human tag: the engine's raytrain-cpu:cpu-latest stays this checkout's
        engine_env = {**base_env, cache.ENV: str(work / "cache-engine"), "INVOKE_IMAGE_HUMAN_TAG": "bench-ci"}
        record(("baseline: fresh runner, the build in the engine (`--load`), `six` added",
                     run_case(checkout_copy(work / "engine"), engine_env, "six==1.17.0", load=True)))
        if peer:
            engine_base = json.loads((ROOT / "build" / "build.json").read_text())["cpu"]["base_ref"]
            (work / "peer").mkdir()
            shutil.copytree(ROOT / "examples" / "train", work / "peer" / "examples" / "train")
            tag = f"{REGISTRY}/bench-peer:latest"
            record(("(d) peer: Dockerfile + `docker push`, first", peer_case(work / "peer", engine_base, pins, "",
                                                                                  tag)))
            record(("(d) peer: Dockerfile + `docker push`, `six` added",
                         peer_case(work / "peer", engine_base, pins, "six==1.17.0", tag)))
    finally:
        stop_local(settings)
        forget_pulls(REGISTRY)
        for made in (work / "engine" / "build" / "build.json", work / "fresh-engine" / "build" / "build.json"):
            if made.is_file():
                for rec in json.loads(made.read_text()).values():
                    subprocess.run(["docker", "rmi", rec["human_ref"], rec["local_ref"]], capture_output=True)
        subprocess.run(["docker", "rmi", f"{REGISTRY}/bench-peer:latest"], capture_output=True)
        subprocess.run(["docker", "image", "prune", "-f"], capture_output=True)  # the peer's dangling first image
        shutil.rmtree(work, ignore_errors=True)
    print(f"CI pipeline, one small wheel added (load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    print("| case | seconds | wheels downloaded | uploaded (layers) |")
    print("| --- | --- | --- | --- |")
    for name, r in rows:
        if r["uploaded"] < 0:  # the peer: docker push names no byte count; its build time and layers pushed
            print(f"| {name} | {r['seconds']:.1f} (build {r['build_seconds']:.1f}) | (in the build) | "
                  f"{r['layers']} of {r['all_layers']} layers |")
            continue
        print(f"| {name} | {r['seconds']:.1f} | {human_bytes(r['downloaded'])} | {human_bytes(r['uploaded'])} "
              f"({r['layers']}) |")
    by = dict(rows)
    baseline = by["baseline: fresh runner, the build in the engine (`--load`), `six` added"]["seconds"]
    for name in ("(a) fresh runner, no engine, cold registry", "(b) fresh runner, no engine, `six` added",
                 "(c) warm runner, no engine, `tabulate` added", "(e) fresh runner, a fresh engine, `toolz` added",
                 "(d) peer: Dockerfile + `docker push`, `six` added"):
        if name in by:
            print(f"ratio {name.split(')')[0]}) / baseline: {by[name]['seconds'] / baseline:.3f}")


if __name__ == "__main__":
    main()

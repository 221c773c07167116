"""Invoke tasks: thin wrappers over toolchain.pipeline. `invoke --list` shows them all.

Chain them on one line: `invoke build push`. Defaults live with the collection
(toolchain/config.py); override them in an invoke.yaml, with INVOKE_* environment variables
(e.g. INVOKE_REGISTRY_ADDRESS=host:5000, INVOKE_PROJECT_SPEC=cluster_specs/x.json for a whole
chain) or with flags.
"""
from __future__ import annotations

import json as jsonlib
import os
import sys
from pathlib import Path

from invoke import Collection, Exit, task

from deploy.targets import TARGETS
from runtime import numbers
from runtime.errors import InputError, RaytrainError
from toolchain import pipeline, registry as registry_mod
from toolchain.config import check_env, defaults, load_settings
from toolchain.progress import Reporter

ROOT = Path(__file__).resolve().parent

# Invoke casts INVOKE_* variables after importing this file and crashes on one it cannot cast:
# check them first, with the variable and the fix.
_ENV_PROBLEMS = check_env(dict(os.environ))
if _ENV_PROBLEMS:
    print("error: " + "\n  ".join(_ENV_PROBLEMS), file=sys.stderr)
    sys.exit(2)


def _run(c, fn, *args, quiet=False, as_json=False, **kwargs):
    """Run one pipeline step; user errors become Exit(msg, code) with nothing half-done."""
    try:
        settings = load_settings(c.config, ROOT)
        rep = Reporter(quiet=quiet or settings.quiet)
        summary = fn(settings, *args, rep=rep, **kwargs)
    except RaytrainError as e:
        raise Exit(f"error: {e}", code=e.exit_code)
    if as_json:
        print(jsonlib.dumps(summary, indent=2, sort_keys=True, default=str))
    return summary


def _count(value, flag: str, low: int = 0):
    """A whole-number flag, or a clean error naming it."""
    if value is None:
        return None
    try:
        return numbers.whole(str(value).strip(), flag, low, 999_999_999)
    except InputError as e:
        raise Exit(f"error: {e}", code=2) from None


COMMON = {
    "quiet": "Print only errors (for CI logs); the result summary still prints.",
    "json": "Print a machine-readable JSON summary on stdout.",
}


@task(help={
    "spec": "Cluster spec JSON to bake in (default: project.spec; for a whole chain set INVOKE_PROJECT_SPEC).",
    "variant": "Comma-separated variants to build: cpu, gpu (default: all in image.variants).",
    **COMMON,
})
def build(c, spec=None, variant=None, quiet=False, json=False):
    """Build the layered images (base -> deps -> app -> spec) for each variant."""
    out = _run(c, pipeline.build, spec, variant, quiet=quiet, as_json=json)
    if not json:
        for v, img in out["images"].items():
            print(f"{v}: {img['local_ref']}  {img['image_id'][:19]}")


@task(help={
    "spec": "Cluster spec JSON the images were built with (its 'registry' overrides registry.address).",
    "variant": "Comma-separated variants to push (default: every variant `invoke build` recorded for this spec).",
    **COMMON,
})
def push(c, spec=None, variant=None, quiet=False, json=False):
    """Push built images (starting the local registry if needed); record digests in build/images.json."""
    out = _run(c, pipeline.push, spec, variant, quiet=quiet, as_json=json)
    if not json:
        for v, img in out["images"].items():
            print(f"{v}: {img['repo_digest']}")
        print(f"recorded in {out['images_json']}")


TARGET_HELP = "; ".join(f"{name}: {t.summary}" for name, t in TARGETS.items())


@task(auto_shortflags=False, help={
    "target": f"Where the job goes (default: deploy.target). {TARGET_HELP}.",
    "spec": "Cluster spec JSON (default: project.spec); must be the one baked into the pushed image.",
    "nodes": "Number of nodes, head included (default: deploy.nodes).",
    "name": "Job name: a DNS-1035 label, lowercase letter first (default: deploy.name).",
    "gpus": "GPUs per node (default: the spec's slurm.gpus_per_node / kubernetes.gpus_per_pod). >0 picks the gpu image.",
    "out": "Directory for the artifacts (default: build/deploy/<target>/<name>). Written all at once.",
    "dry_run": "Print the pre-flight result and the rendered artifacts; write, convert and start nothing.",
    "command": "The driver command, as one shell-quoted string (e.g. \"python train.py --steps 200\"); it runs on the "
               "head in the image's project directory. Default: deploy.command.",
    "resume": "Continue the last run deployed under this --name (its checkpoints) instead of starting a new run. "
              "Without it every deploy is a new run; a scheduler's own restart (requeue, a replaced pod) "
              "always continues its run.",
    "submit": "slurm/pyxis: sbatch the script; k8s: create the token Secret and kubectl apply; skypilot: sky launch.",
    "seeds": "k8s/skypilot: one independent run per seed, e.g. '1-4' or '1,5,9' (<name>-s<seed>; --seed is appended).",
    "slots": "k8s with --seeds: NODE[:GPU] slots the runs are pinned to round-robin, e.g. 'node1:0,node1:1,node2'.",
    "sqsh": "pyxis: convert the image to an enroot .sqsh (cached by digest in build/sqsh) and run from that file. "
            "The first conversion squashes the deps/base layers once (a minute or two); after a code change only "
            "the app and spec layers are appended (seconds).",
    "sqsh_to_fileroot": "pyxis --sqsh: also copy the .sqsh to <fileroot>/images/ and point srun at that copy.",
    "spare_nodes": "slurm/pyxis: allocate this many nodes beyond --nodes, with --no-kill: a node that fails leaves the "
                   "job, and the worker group moves its ranks onto a spare without a requeue (default 0: a failed "
                   "node requeues the whole job, which resumes its run from the checkpoint).",
    "port_stride": "slurm/pyxis: offset between the Ray ports of nodes that share a host (several slurmd per host).",
    "partition": "slurm/pyxis: Slurm partition (overrides slurm.partition; default: the cluster's default partition).",
    "account": "slurm/pyxis: Slurm account (overrides slurm.account).",
    "allow_local_registry": "pyxis/k8s/skypilot: accept an image in a loopback registry (only when the nodes are this "
                            "machine; otherwise push to a registry they reach, or use --sqsh).",
    "allow_http_registry": "pyxis: accept a plain-HTTP registry (the site's enroot.conf has ENROOT_ALLOW_HTTP=yes).",
    "accelerator": "skypilot: accelerator name for resources.accelerators (default: the spec's one GPU type).",
    "fileroot_store": "skypilot: bucket URI mounted at the fileroot (e.g. s3://bucket/runs).",
    **COMMON,
})
def deploy(c, target=None, spec=None, nodes=None, name=None, gpus=None, out=None, dry_run=False, resume=False,
           command=None, submit=False,
           seeds=None, slots=None, sqsh=False, sqsh_to_fileroot=False, port_stride=None, spare_nodes=None,
           partition=None, account=None,
           allow_local_registry=False, allow_http_registry=False, accelerator=None, fileroot_store=None,
           quiet=False, json=False):
    """Render the job for a target from the pushed digest (build/images.json); run it (local) or write it.

    Pre-flight checks (the spec baked into the image, registry reachability, job values, the target's
    own checks; a flag the target does not take) run first and list every problem; on failure nothing
    is written (exit 2). One spec for the whole chain:
    INVOKE_PROJECT_SPEC=cluster_specs/x.json invoke build push deploy --target pyxis
    """
    given = dict(submit=submit, seeds=seeds, slots=slots, sqsh=sqsh, sqsh_to_fileroot=sqsh_to_fileroot,
                 port_stride=_count(port_stride, "--port-stride"), spare_nodes=_count(spare_nodes, "--spare-nodes"),
                 partition=partition, account=account,
                 allow_local_registry=allow_local_registry, allow_http_registry=allow_http_registry,
                 accelerator=accelerator, fileroot_store=fileroot_store)
    flags = {k: v for k, v in given.items() if v not in (None, False)}  # only what the user set
    result = _run(c, pipeline.deploy, spec, target, quiet=quiet, as_json=json, dry_run=dry_run, resume=resume,
                  command=command, name=name, nodes=_count(nodes, "--nodes", 1), gpus=_count(gpus, "--gpus"), out=out, **flags)
    if json:
        return
    if dry_run:
        for fname, text in result.get("rendered", {}).items():
            print(f"# ---- {fname} (dry run: not written)\n{text}")
        if result.get("objects"):
            print(jsonlib.dumps(result["objects"], indent=2, default=str))
        return
    if result.get("exit_code") is not None:
        print(f"job {result['job']['name']} finished with exit code {result['exit_code']}")
    for w in result.get("written", []):
        print(f"wrote {w}")
    if result.get("slurm_job_id"):
        print(f"submitted Slurm job {result['slurm_job_id']}")


@task(help={"spec": "Cluster spec JSON with a 'kubernetes' section (default: project.spec).",
            "name": "Job name (or the fan-out's name) given to deploy (default: deploy.name)."})
def destroy(c, spec=None, name=None):
    """Delete what `deploy --target k8s --submit` created: its Jobs, pods, Service and Secret, by label."""
    out = _run(c, pipeline.destroy, spec, name)
    print(out["kubectl"].strip() or f"nothing labelled with {out['group']} in {out['namespace']}")


# -- spec ------------------------------------------------------------------------
@task(help={"file": "Path to the cluster spec JSON to validate.", "json": COMMON["json"]})
def check(c, file, json=False):
    """Validate a cluster spec and print what it resolved to (exit 2 if invalid)."""
    try:
        out = pipeline.check_spec(Path(file))
    except RaytrainError as e:
        raise Exit(f"error: {e}", code=e.exit_code)
    if json:
        print(jsonlib.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:12} {v}")


@task(help={"out": "Where to write the JSON Schema (default: cluster_specs/schema.json)."})
def schema(c, out="cluster_specs/schema.json"):
    """Write the cluster spec's JSON Schema (for editors and CI validation)."""
    print(pipeline.write_schema(ROOT / out))


# -- base and registry -------------------------------------------------------------
@task(name="bootstrap", help=COMMON)
def base_bootstrap(c, quiet=False, json=False):
    """Make the base image offline with debootstrap + docker import (reused when present)."""
    out = _run(c, pipeline.bootstrap_base, quiet=quiet, as_json=json)
    if not json:
        print(out["base"])


@task(help={"quiet": COMMON["quiet"]})
def start(c, quiet=False):
    """Start the local docker-registry on registry.address (no-op if it answers)."""
    st = _run(c, registry_mod.start_local, quiet=quiet)
    print(f"registry {st.address} up" + (f" (pid {st.pid})" if st.pid else ""))


@task
def stop(c):
    """Stop the local registry started by `registry.start` / `push`."""
    settings = load_settings(c.config, ROOT)
    print("stopped" if registry_mod.stop_local(settings) else "not running (nothing started by this project)")


@task
def status(c):
    """Say whether the configured registry answers."""
    settings = load_settings(c.config, ROOT)
    st = registry_mod.status(settings)
    print(f"registry {st.address}: {'up' if st.reachable else 'down'}")
    if not st.reachable:
        raise Exit(code=1)


spec_ns = Collection("spec", check, schema)
base_ns = Collection("base", base_bootstrap)
registry_ns = Collection("registry", start, stop, status)
ns = Collection(build, push, deploy, destroy, spec_ns, base_ns, registry_ns)
ns.configure(defaults())  # the one source of defaults (toolchain/config.py); invoke.yaml / INVOKE_* / flags override

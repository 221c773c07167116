"""The task collection: thin wrappers over toolchain.pipeline. `raytrain --list` shows them all.

`raytrain` (toolchain/cli.py) runs them in the project found from the current directory
(toolchain/project.py), with every configuration file read through the bounded loader
(toolchain/config_files.py). The top-level tasks.py of a checkout is a shim over this module, for
plain `invoke`, which reads /etc/invoke.yaml and ~/.invoke.yaml itself, without those bounds.

Chain them on one line: `raytrain build push`. Defaults live with the collection
(toolchain/config.py); a project overrides them in its settings (raytrain.yaml or [tool.raytrain]),
with INVOKE_* environment variables (e.g. INVOKE_REGISTRY_ADDRESS=host:5000,
INVOKE_PROJECT_SPEC=cluster_specs/x.json for a whole chain) or with flags.
"""
from __future__ import annotations

import json as jsonlib
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from invoke import Collection, Exit, task
from pydantic import BaseModel

from deploy import hint
from deploy.job import MAX_NODES
from deploy.targets import HOLDING, TARGETS
from deploy.targets.flags import FLAGS as TARGET_FLAGS  # the target flags, from the targets' Options models
from runtime import numbers
from runtime.contract import TORCHRUN_MAX_NPROC, TORCHRUN_MAX_RESTARTS
from runtime.errors import InputError
from toolchain import boundary, pipeline, project
from toolchain.publish import local_registry
from toolchain.config import check_env, defaults, load_settings
from toolchain.job_inputs import given
from toolchain.progress import Reporter, human_bytes

# Invoke casts INVOKE_* variables after importing this file and crashes on one it cannot cast:
# check them first, with the variable and the fix.
_ENV_PROBLEMS, _ENV_BOOLEANS = check_env(dict(os.environ))
if _ENV_PROBLEMS:
    print("error: " + "\n  ".join(_ENV_PROBLEMS), file=sys.stderr)
    sys.exit(2)
os.environ.update(_ENV_BOOLEANS)  # 'false' as Invoke reads it ('0'), not as True


@contextmanager
def _boundary():
    """The error boundary (toolchain/boundary.py) around a task: what a user can cause becomes one
    line and its exit code, nothing half-done; anything else is a bug, shown as one."""
    try:
        with boundary.sigterm_unwinds():
            yield
    except Exit:
        raise
    except Exception as e:  # noqa: BLE001 - the boundary decides what is the user's doing
        failure = boundary.explain(e)
        if failure is None:
            raise Exit(code=boundary.report_bug(e)) from None
        raise Exit(failure.message, code=failure.code) from None


def _settings(c):
    """The validated settings of the project found from the current directory; none found is one line
    saying how to make one."""
    located = project.locate()
    if not located.found:
        raise project.not_found(located, hint.program())
    return load_settings(c.config, located)


def _run(c, fn, *args, quiet=False, as_json=False, **kwargs):
    """Run one pipeline step with the validated settings, inside the boundary."""
    with _boundary():
        settings = _settings(c)
        rep = Reporter(quiet=quiet or settings.quiet)
        summary = fn(settings, *args, rep=rep, **kwargs)
    if as_json:
        shown = summary.model_dump(mode="json") if isinstance(summary, BaseModel) else summary
        print(jsonlib.dumps(shown, indent=2, sort_keys=True, default=str))
    return summary


def _count(value, flag: str, low: int = 0, high: int = numbers.COUNT_MAX):
    """A whole-number flag, or a clean error naming it."""
    if value is None:
        return None
    try:
        return numbers.whole(str(value), flag, low, high)
    except InputError as e:
        raise Exit(f"error: {e}", code=2) from None


def _target_flags(options: dict) -> dict:
    """Only the target flags the user set, whole numbers within the option's bounds; exit 2 otherwise."""
    try:
        return TARGET_FLAGS.given(options)
    except InputError as e:
        raise Exit(f"error: {e}", code=2) from None


COMMON = {
    "quiet": "Print only errors (for CI logs); the result summary still prints.",
    "json": "Print a machine-readable JSON summary on stdout.",
}
TORCHRUN_HELP = {
    "torchrun": "A script written for torchrun, as one shell-quoted string (\"train.py --epochs 3\", or \"-m pkg.train\"): "
                "every node runs --nproc-per-node ranks of it with torchrun's environment (RANK, LOCAL_RANK, "
                "WORLD_SIZE, MASTER_ADDR, ...). Instead of --command.",
    "nproc_per_node": "With --torchrun: ranks on each node (default: the node's GPUs, or 1 without GPUs).",
    "max_restarts": "With --torchrun: how often the whole group starts again after a rank fails (default 0), as "
                    "torchrun's; then the job's exit code is the first failing rank's.",
}
ENV_HELP = ("KEY=VALUE: an environment variable for every process of the job, over deploy.env (repeat it: "
            "--env NCCL_DEBUG=INFO --env ACCELERATE_USE_CPU=1). Not for secrets: it is written into the artifacts.")


@task(help={
    "spec": "Cluster spec JSON to bake in (default: project.spec; for a whole chain set INVOKE_PROJECT_SPEC).",
    "variant": "Comma-separated variants to build: cpu, gpu (default: all in image.variants).",
    "profile": ("default, or skypilot: the image plus sudo for its user and the tools SkyPilot's pod setup "
                "needs, one small layer on top (for --target skypilot; default: image.profile)."),
    "load": ("Build in the local Docker engine, to run the image here with `docker run`. Without it the engine "
             "builds the cpu image where it already holds this project's stages; the gpu image (the local target "
             "does not run it), and any image elsewhere (a CI runner), is made from what the registry holds; the local "
             "target and --sqsh then load it from this machine's build (only the layers the engine lacks), or pull "
             "it where the build left too little (docs/ci.md)."),
    **COMMON,
})
def build(c, spec=None, variant=None, profile=None, load=False, quiet=False, json=False):
    """Build the layered images (base -> deps -> app -> spec) for each variant."""
    out = _run(c, pipeline.build, spec, variant, quiet=quiet, as_json=json, profile=profile, load=load)
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
    **TORCHRUN_HELP,
    "env": ENV_HELP,
    **TARGET_FLAGS.help(),  # every target option: help, type and default from its target's Options model
    **COMMON,
}, iterable=["env"])
@TARGET_FLAGS.add_to  # one parameter per target option in place of **options (Invoke reads __signature__)
def deploy(c, target=None, spec=None, nodes=None, name=None, gpus=None, out=None, dry_run=False, resume=False,
           command=None, torchrun=None, nproc_per_node=None, max_restarts=None, env=None, quiet=False, json=False,
           **options):
    """Render the job for a target from the pushed digest (build/images.json); run it (local) or write it.

    Pre-flight checks (the spec baked into the image, registry reachability, job values, the target's
    own checks; a flag the target does not take) run first and list every problem; on failure nothing
    is written (exit 2). One spec for the whole chain:
    INVOKE_PROJECT_SPEC=cluster_specs/x.json invoke build push deploy --target pyxis
    """
    flags = _target_flags(options)
    result = _run(c, pipeline.deploy, spec, target, quiet=quiet, as_json=json, dry_run=dry_run, resume=resume,
                  command=command, name=name, nodes=_count(nodes, "--nodes", 1, MAX_NODES), gpus=_count(gpus, "--gpus"), out=out,
                  torchrun=torchrun, nproc_per_node=_count(nproc_per_node, "--nproc-per-node", 1, TORCHRUN_MAX_NPROC),
                  max_restarts=_count(max_restarts, "--max-restarts", 0, TORCHRUN_MAX_RESTARTS), job_env=env, **flags)
    if json:
        return
    if dry_run:
        pipeline.show_dry_run(result.rendered, result.objects)
        return
    if result.applied.exit_code is not None:
        print(f"job {result.job['name']} finished with exit code {result.applied.exit_code}")
    if result.applied.slurm_job_id and quiet:  # otherwise its progress line said it, with the output file
        print(f"submitted Slurm job {result.applied.slurm_job_id}")


@task(help={"target": "The target the job was deployed to with --submit (default: deploy.target): k8s deletes "
                      "by label, skypilot runs `sky down` for the clusters recorded as launched (build/launched.json); "
                      "the others' jobs end by themselves.",
            "spec": "Cluster spec JSON (default: project.spec); for k8s, its 'kubernetes' section's namespace.",
            "name": "Job name (or the fan-out's name) given to deploy (default: deploy.name)."})
def destroy(c, target=None, spec=None, name=None):
    """Delete what `deploy --submit` left running: on k8s its Jobs, pods, Services and Secrets, by label; on
    skypilot the clusters it launched."""
    out = _run(c, pipeline.destroy, spec, target, name)
    if "kubectl" in out:  # what kubectl deleted (the progress line said the rest)
        print(out["kubectl"].strip() or f"nothing labelled with {out['group']} in {out['namespace']}")


# -- held clusters: code moves, the cluster stays (toolchain/held.py) ----------------
@task(name="up", auto_shortflags=False, help={
    "target": f"Where the cluster goes (default: deploy.target); held clusters: {', '.join(HOLDING)}.",
    "spec": "Cluster spec JSON (default: project.spec); must be the one baked into the pushed image.",
    "nodes": "Number of nodes, head included (default: deploy.nodes).",
    "name": "The cluster's name (default: deploy.name); `invoke run/status/down --name` use it.",
    "env": ENV_HELP,
    **TARGET_FLAGS.help(),  # the same target options as deploy (a Slurm partition, a port stride, ...)
    **COMMON,
}, iterable=["env"])
@TARGET_FLAGS.add_to
def held_up(c, target=None, spec=None, nodes=None, name=None, env=None, quiet=False, json=False, **options):
    """Start a held cluster: deploy's nodes, the head serving drivers (invoke run) instead of running one.

    The nodes run the pushed digest, or the nodes' own environment on plain Slurm.

    Returns once every node is up and the barrier passed (on Slurm: once the job runs and its head serves).
    Then `invoke run` sends code to it (seconds), `invoke status` shows it and `invoke down` ends it.
    """
    from toolchain import held
    flags = _target_flags(options)
    out = _run(c, held.up, spec, target, quiet=quiet, as_json=json, name=name, nodes=_count(nodes, "--nodes", 1, MAX_NODES),
               job_env=env, **flags)
    if quiet and not json:  # otherwise its progress line said it
        print(f"cluster {out['cluster']['name']} is up ({out['cluster']['target']}, {out['cluster']['image']})")


@task(name="run", auto_shortflags=False, help={
    "name": "The held cluster (default: deploy.name).",
    "command": "The driver command, as one shell-quoted string (default: deploy.command); it runs on the head "
               "in the code that was sent.",
    **TORCHRUN_HELP,
    "spec": "Cluster spec JSON (default: project.spec); a spec other than the cluster's is refused.",
    **COMMON,
})
def held_run(c, name=None, command=None, torchrun=None, nproc_per_node=None, max_restarts=None, spec=None,
             quiet=False, json=False):
    """Send the project's code (project.app_dir) to a held cluster and run the driver there; its exit code.

    Only the code moves: a change to requirements, the base, the runtime package or the spec is refused
    (redeploy: invoke build push && invoke down && invoke up). The run is recorded in build/runs.json with
    the image digest and the code's hash.
    """
    from toolchain import held
    out = _run(c, held.run, spec, quiet=quiet, as_json=json, name=name, command=command, torchrun=torchrun,
               nproc_per_node=_count(nproc_per_node, "--nproc-per-node", 1, TORCHRUN_MAX_NPROC),
               max_restarts=_count(max_restarts, "--max-restarts", 0, TORCHRUN_MAX_RESTARTS))
    if not json:
        print(f"run {out['run_id']} finished with exit code {out['exit_code']}")


@task(name="status", help={"name": "One held cluster (default: all recorded).", "json": COMMON["json"]})
def held_status(c, name=None, json=False):
    """Say what each held cluster (invoke up) runs and whether its nodes are up; exit 1 if one is not.

    The registry's own check is `registry.ping`."""
    from toolchain import held
    out = _run(c, held.status, as_json=json, name=name)
    if not json:
        if not out:
            print(f"no held clusters (`{hint.cmd('up')}` starts one)")
        for cname, st in out.items():
            print(f"{cname}: {'up' if st['up'] else 'NOT UP'} ({st['target']}, {st['image']}, since {st['started']})")
            for node, state in st["nodes"].items():
                print(f"  {node}: {state}")
            if st.get("curves"):
                print(f"  curves of the last run: {st['curves']} (on the cluster's fileroot: "
                      f"tensorboard --logdir {st['curves']})")
    if any(not st["up"] for st in out.values()):
        raise Exit(code=1)


@task(name="down", help={"name": "The held cluster (default: deploy.name).", "quiet": COMMON["quiet"]})
def held_down(c, name=None, quiet=False):
    """End a held cluster (invoke up): the head stops serving, the nodes leave, the target's objects go.

    What the target made is removed: the containers and network; the Slurm job; the Kubernetes objects;
    the SkyPilot cluster."""
    from toolchain import held
    out = _run(c, held.down, quiet=quiet, name=name)
    if quiet:  # otherwise its progress line said it
        print(f"cluster {out['cluster']} is down")


# -- a project: its settings, and the caches -----------------------------------------
@task(name="init", help={
    "entry": "The script that starts the training, in the project (default: train.py when there is one); "
             "the job runs `python ENTRY` on the head.",
    "command": "The driver command instead of --entry, as one shell-quoted string (\"python -m pkg.train --x 1\").",
    "torchrun": "A script written for torchrun instead of --entry (\"train.py --epochs 3\"): every node runs its ranks "
                "with torchrun's environment (deploy --nproc-per-node sets how many).",
    "name": "The project's name: its images (<name>-cpu, <name>-gpu) and jobs (default: [project] name of "
            "pyproject.toml, else the directory's name).",
    "example": "Write the toolchain's example project (a Ray driver over worker groups) into this empty directory.",
    "dry_run": "Print what would be written; write nothing.",
})
def init(c, entry=None, command=None, torchrun=None, name=None, example=False, dry_run=False):
    """Make this directory a raytrain project: its settings in pyproject.toml ([tool.raytrain]) or
    raytrain.yaml, and a cluster spec for the local target (cluster_specs/local.json).

    The code and its requirements are found in the repository (uv.lock, pylock.toml, requirements.txt or
    pyproject.toml's dependencies); existing settings are never overwritten. Then:
    raytrain build push deploy --target local
    """
    from toolchain import scaffold
    with _boundary():
        root = Path.cwd()
        plan = (scaffold.plan_example(root, given(name, "--name")) if example else
                scaffold.plan_init(root, given(entry, "--entry"), given(command, "--command"), given(name, "--name"),
                                   given(torchrun, "--torchrun")))
        if dry_run:
            for path, text in plan.writes.items():
                print(f"--- {path} ---\n{text}")
        else:
            for path in scaffold.apply(plan):
                print(f"wrote {path.relative_to(root)}")
    for note in plan.notes:
        print(f"note: {note}")
    if not dry_run:
        print(f"next: {hint.cmd('build push deploy --target local')}   (then `{hint.cmd('up')}` and "
              f"`{hint.cmd('run')}` to iterate on the code)")


@task(help={"cache": "Remove the user's cache (toolchain/cache.py: the wheel pool, the wheel sets, the layer index, "
                     "the blob digests): every project's, rebuilt on demand.",
            "build": "Remove this project's build directory (project.build_dir: its records, layers and blobs; the "
                     "next push and deploy need a build again)."})
def clean(c, cache=False, build=False):
    """Free disk: the shared cache (--cache) and/or this project's build directory (--build)."""
    from toolchain import cache as user_cache
    if not (cache or build):
        raise Exit("error: clean: say what to remove: --cache (the user's cache), --build (this project's build "
                   "directory), or both", code=2)
    with _boundary():
        if build:
            settings = _settings(c)
            from toolchain.cache import size_of
            freed = size_of(settings.build_dir) if settings.build_dir.is_dir() else 0
            shutil.rmtree(settings.build_dir, ignore_errors=True)
            print(f"removed {settings.build_dir} ({human_bytes(freed)})")
        if cache:
            where, freed = user_cache.clear()
            print(f"removed the cache under {where} ({human_bytes(freed)})")


# -- spec ------------------------------------------------------------------------
@task(help={"file": "Path to the cluster spec JSON to validate.", "json": COMMON["json"]})
def check(c, file, json=False):
    """Validate a cluster spec and print what it resolved to (exit 2 if invalid)."""
    with _boundary():
        out = pipeline.check_spec(Path(file))
    if json:
        print(jsonlib.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:12} {v}")


@task(help={"out": "Where to write the JSON Schema (default: cluster_specs/schema.json, in the project's root or "
                   "else the current directory)."})
def schema(c, out="cluster_specs/schema.json"):
    """Write the cluster spec's JSON Schema (for editors and CI validation)."""
    with _boundary():
        print(pipeline.write_schema(project.locate().root / out))


# -- base and registry -------------------------------------------------------------
@task(name="bootstrap", help=COMMON)
def base_bootstrap(c, quiet=False, json=False):
    """Make the base image offline with debootstrap + docker import (reused when present)."""
    out = _run(c, pipeline.bootstrap_base, quiet=quiet, as_json=json)
    if not json:
        print(out["base"])


@task(name="publish", help={
    "to": "registry/repository to push the base to (default: registry.address/<image.repository>-base).",
    **COMMON,
})
def base_publish(c, to=None, quiet=False, json=False):
    """Push the base image (made here by debootstrap, or image.base_image from the local engine) to a
    registry, and print its pinned reference. A runner with no engine finds this project's own base in the
    registry it pushes to (at the default --to); a base elsewhere is named by that reference as image.base_image."""
    out = _run(c, pipeline.push_base, to, quiet=quiet, as_json=json)
    if not json:
        print(out["base_image"])


@task(help={"quiet": COMMON["quiet"]})
def start(c, quiet=False):
    """Start the local docker-registry on registry.address (no-op if it answers)."""
    st = _run(c, local_registry.start_local, quiet=quiet)
    print(f"registry {st.address} up" + (f" (pid {st.pid})" if st.pid else ""))


@task
def stop(c):
    """Stop the local registry started by `registry.start` / `push`."""
    with _boundary():
        settings = _settings(c)
        stopped = local_registry.stop_local(settings)
        answering = not stopped and local_registry.status(settings).reachable
    if stopped:
        print("stopped")
    elif answering:
        print(f"not stopped: a registry answers at {settings.registry.address}, but not one this project started "
              "(its registry.pid names none of them); stop it where it was started")
    else:
        print("not running (nothing started by this project)")


@task(name="ping")
def registry_ping(c):
    """Say whether the configured registry (registry.address) answers; exit 1 if not.

    Held clusters have their own `status` (invoke up/run/status/down)."""
    with _boundary():
        st = local_registry.status(_settings(c))
    print(f"registry {st.address}: {'up' if st.reachable else 'down'}")
    if not st.reachable:
        raise Exit(code=1)


spec_ns = Collection("spec", check, schema)
base_ns = Collection("base", base_bootstrap, base_publish)
registry_ns = Collection("registry", start, stop, registry_ping)
ns = Collection(init, build, push, deploy, destroy, held_up, held_run, held_status, held_down, clean, spec_ns, base_ns,
                registry_ns)
ns.configure(defaults())  # the one source of defaults (toolchain/config.py); the project's settings, INVOKE_* and flags override


def under_plain_invoke(collection: Collection) -> None:
    """Plain `invoke` (a checkout's tasks.py): the project's settings as the collection's configuration
    (`raytrain` puts them at Invoke's project level instead: toolchain/config_files.py)."""
    located = project.locate()
    if located.found and located.settings:
        collection.configure(located.settings)

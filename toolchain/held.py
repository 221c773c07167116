"""Held clusters: code moves, the cluster stays.

    up      deploy's pre-flight and artifacts, the head serving instead of running a driver; recorded
            in build/clusters.json (what image, what is below the code, which project)
    run     the project's code only (project.app_dir, as the app layer's key hashes it), sent to the
            head and run as a driver there; Ray ships it to every node as the job's working_dir
    status  what the target says of the held nodes
    down    the head is told to stop (the nodes leave with 0), everything is removed

`run` refuses what the running image cannot honour: a change below the code (requirements, base,
torch, image settings), in the runtime package, or in the spec; a cluster started by another
project; an image that is no longer the one the spec's build recorded. Each refusal says to
redeploy. Each run that succeeds is recorded (build/runs.json) with the image digest and the code's
hash, so `invoke build` from that code makes the image the run ran (the app layer's key is that
hash); a failed run leaves the file as it was.
"""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Optional

from deploy import hint
from deploy.job import job_variant
from deploy.targets import HOLDING, TARGETS
from deploy.targets.base import HeldContext
from runtime import contract as C
from runtime.spec import load_spec, read_spec, spec_hash
from toolchain.image import layers
from toolchain import pipeline
from toolchain.config import Settings
from toolchain.docker_client import engine
from toolchain.errors import ConfigError, ToolchainError
from toolchain.job_inputs import driver_command, given, now, pick_run, resolve_spec
from toolchain.image.images import source_keys
from toolchain.progress import Reporter
from toolchain.records import (ClusterRecord, RunRecord, drop_cluster, read_builds, read_clusters, read_runs, restore_run,
                               runs_before, write_cluster, write_run)

CODE_DIR = "raytrain-code"  # each code version a cluster was sent, by content: <where the target unpacks>/CODE_DIR/<hash>


def _target(name: str):
    if name not in HOLDING:
        raise ConfigError(f"--target {name}: held clusters (up/run/status/down) are available for: "
                          f"{', '.join(HOLDING)}; "
                          f"use `{hint.cmd(f'deploy --target {name}')}` for a one-off job")
    return TARGETS[name]


def _context(env: dict | None, out=None):
    return HeldContext(engine=engine, env=dict(os.environ if env is None else env), out=out)


def _up_args(spec: str | None, nodes: int | None, flags: dict) -> list[str]:
    """The flags `up` was given beyond --target and --name, word by word (each flag, then its value)."""
    given_flags = {"spec": spec, "nodes": nodes, **flags}
    words = []
    for key, value in given_flags.items():
        if value is None or value is False:
            continue
        words.append(f"--{key.replace('_', '-')}")
        if value is not True:
            words.append(str(value))
    return words


def _up_again(record: ClusterRecord) -> str:
    """The `up` that starts this cluster again, with the flags it was started with: every word quoted for a
    shell, from the record's checked values."""
    words = ["up", "--target", record.target, "--name", record.name, *record.up_args]
    return hint.cmd(" ".join(shlex.quote(w) for w in words))


def _cluster(settings: Settings, name: Optional[str]) -> ClusterRecord:
    name = settings.deploy.name if name is None else name
    record = read_clusters(settings.build_dir).get(name)
    if record is None:
        raise ConfigError(f"no held cluster named {name!r} ({settings.build_dir / 'clusters.json'}); start one with "
                          f"`{hint.cmd(f'up --target {settings.deploy.target} --name {name}')}` (with the target's "
                          "flags, e.g. --sqsh for pyxis)")
    return record


def up(settings: Settings, spec: str | None, target: str | None, *, rep: Reporter, name: str | None = None,
       nodes: int | None = None, env: dict | None = None, job_env: list[str] | None = None, **flags) -> dict:
    job_name = settings.deploy.name if name is None else name
    if job_name in read_clusters(settings.build_dir):
        raise ConfigError(f"a held cluster named {job_name!r} is already recorded; `{hint.cmd(f'status --name {job_name}')}`, "
                          f"`{hint.cmd(f'down --name {job_name}')}` first, or give another --name")
    target_name = given(target, "--target") or settings.deploy.target
    held_target = _target(target_name)
    variant = None
    loaded = read_spec(resolve_spec(settings, spec))
    if held_target.needs_image:  # the nodes run the image: what it was built from is what run compares with
        variant = job_variant(held_target.spec_gpus(loaded.model))
        built = read_builds(settings.build_dir).get(variant)
        if built is None or not built.below_app_key:
            raise ToolchainError(f"{settings.build_dir / 'build.json'} has no source keys for {variant}: run "
                                 f"`{hint.cmd('build')}` (this toolchain records them) before `{hint.cmd('up')}`")
        keys, spec_sha = {"below_app_key": built.below_app_key, "runtime_sha256": built.runtime_sha256}, built.spec_sha256
    else:  # the nodes run this tree's environment (plain Slurm): what it is now
        keys = source_keys(settings)
        spec_sha = loaded.sha256
    deployed = pipeline.deploy(settings, spec, target_name, rep=rep, name=job_name, nodes=nodes, serve=True,
                               env=_context(env).env, job_env=job_env, **{"submit": True, **flags})
    record = ClusterRecord(name=job_name, target=target_name, image=deployed.job["image"] or "", variant=variant or "",
                           spec_sha256=spec_sha, below_app_key=keys["below_app_key"],
                           runtime_sha256=keys["runtime_sha256"], project=str(settings.root.resolve()),
                           started=now(), handle=deployed.applied.held, up_args=_up_args(spec, nodes, flags))
    write_cluster(settings.build_dir, record)
    rep.step(f"held cluster {job_name}: {deployed.job['nodes']} node(s) of {record.image or 'the nodes environment'}; "
             f"`{hint.cmd(f'run --name {job_name}')}` sends code to it, `{hint.cmd(f'down --name {job_name}')}` ends it")
    return {"cluster": record.model_dump(), "out_dir": deployed.out_dir}


def guard(settings: Settings, record: ClusterRecord, spec_file: Path, keys: dict) -> list[str]:
    """Why this tree (KEYS: toolchain.image.images.source_keys) cannot run on the held cluster (each with the
    fix); [] when it can."""
    build = "build --profile skypilot push" if record.target == C.SKYPILOT_PROFILE else "build push"  # its pre-flight
    redeploy = f"rebuild and redeploy: {hint.cmd(build)} && {hint.cmd(f'down --name {record.name}')} && {_up_again(record)}"
    problems = []
    if record.project != str(settings.root.resolve()):
        problems.append(f"the held cluster {record.name!r} was started by the project at {record.project}, not this "
                        "one; give another --name, or run from that project")
    if keys["below_app_key"] != record.below_app_key:
        problems.append(f"requirements, the base or the image settings changed since the cluster's image was built; {redeploy}")
    if keys["runtime_sha256"] != record.runtime_sha256:
        problems.append(f"the runtime package ({settings.runtime_dir}) changed; it is part of the image, "
                        f"not of the code `run` sends; {redeploy}")
    if spec_hash(spec_file) != record.spec_sha256:
        problems.append(f"the cluster spec {spec_file} is not the one baked into the cluster's image; {redeploy}")
    return problems


def code_archive(app_dir: Path, rel_dir: str) -> bytes:
    """The project's code as a tar under REL_DIR (relative: the target unpacks it in a directory whose
    own mode the tar must not carry), the app layer's files with the same bytes."""
    return layers.make_layer(layers.files_under(app_dir, rel_dir)).data


def run(settings: Settings, spec: str | None, *, rep: Reporter, name: str | None = None,
        command: str | None = None, env: dict | None = None, out=None, torchrun: str | None = None,
        nproc_per_node: int | None = None, max_restarts: int | None = None) -> dict:
    t0 = time.monotonic()
    record = _cluster(settings, name)
    target = _target(record.target)
    ctx = _context(env, out)
    state = target.held_status(record.handle, ctx)
    if not state.up:
        raise ToolchainError(f"the held cluster {record.name!r} is not running ({state.nodes}); "
                             f"`{hint.cmd(f'down --name {record.name}')}` clears its record, then `{_up_again(record)}`")
    checked = time.monotonic() - t0
    spec_file = resolve_spec(settings, spec)
    keys = source_keys(settings)  # the tree hashed once: the guard's keys and the code's hash
    problems = guard(settings, record, spec_file, keys)
    if problems:
        raise ConfigError(f"`{hint.cmd('run')}` cannot send this code to {record.name!r}:\n  - " + "\n  - ".join(problems))
    app_dir = settings.path(settings.project.app_dir)
    code_sha = keys["code_sha256"]
    rel_dir = f"{CODE_DIR}/{code_sha[:16]}"
    argv = driver_command(settings, command, torchrun, nproc_per_node, max_restarts)
    run_id = pick_run(settings, record.name, resume=False)
    tar = code_archive(app_dir, rel_dir)
    rep.step(f"run {run_id}: code {code_sha[:12]} ({len(tar) // 1024} KiB) to {record.name} "
             f"(the cluster answered in {checked:.2f}s)")
    before = runs_before(settings.build_dir)
    write_run(settings.build_dir, record.name, RunRecord(run_id=run_id, target=record.target, image=record.image,
                                                         started=now(), code_sha256=code_sha))
    code = None
    try:
        code = target.held_run(record.handle, ctx, tar, rel_dir, argv, {C.RUN_ID: run_id, C.JOB_NAME: record.name})
    finally:
        if code != 0:  # the record is of runs that ran to the end: a failed one leaves runs.json as it was
            restore_run(settings.build_dir, record.name, before)
    if code != 0:
        raise ToolchainError(f"the run {run_id} on {record.name!r} failed with exit code {code}; its output above "
                             "says why (build/runs.json is as it was)")
    return {"run_id": run_id, "cluster": record.name, "image": record.image, "code_sha256": code_sha,
            "exit_code": code}


def status(settings: Settings, *, rep: Reporter, name: str | None = None, env: dict | None = None) -> dict:
    records = read_clusters(settings.build_dir)
    if name is None:
        wanted = list(records.values())
    elif name in records:
        wanted = [records[name]]
    else:
        raise ConfigError(f"no held cluster named {name!r} ({settings.build_dir / 'clusters.json'})")
    out = {}
    by_target: dict[str, list] = {}
    for record in wanted:  # each scheduler is asked once for all its held clusters, where it can answer so
        by_target.setdefault(record.target, []).append(record)
    runs = read_runs(settings.build_dir)
    fileroot = load_spec(resolve_spec(settings, None)).fileroot
    for target_name, group in by_target.items():
        states = _target(target_name).held_status_many([r.handle for r in group], _context(env))
        for record, state in zip(group, states):
            last = runs.get(record.name)
            # the last `run`'s TensorBoard event files, as the example writes them, in the cluster's fileroot
            curves = f"{fileroot}/runs/{record.name}/{last.run_id}" if last and last.code_sha256 else None
            out[record.name] = {"target": record.target, "image": record.image, "started": record.started,
                                "curves": curves, "up": state.up, "nodes": state.nodes}
    return {name: out[name] for name in (r.name for r in wanted)}


def down(settings: Settings, *, rep: Reporter, name: str | None = None, env: dict | None = None) -> dict:
    record = _cluster(settings, name)
    removed = _target(record.target).held_down(record.handle, _context(env))
    drop_cluster(settings.build_dir, record.name)
    shown = ", ".join(removed[:8]) + (f" and {len(removed) - 8} more" if len(removed) > 8 else "")
    rep.step(f"held cluster {record.name} is down: removed {shown or 'nothing (already gone)'}")
    return {"cluster": record.name, "removed": removed}

"""From flags, spec and the pushed image to a target's artifacts: every problem at once, or a plan.

    request = make_request(...)   # the target, its options and the job; problems collected, not raised one by one
    artifacts = plan(request)     # common + target pre-flight, then the target's pure render (the dry run)
    target.apply(artifacts, ...)  # the only step with side effects
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from deploy import hint
from deploy.job import DeployError, ImageInfo, JobSpec, PreflightError, job_variant, make_job
from deploy.targets import get as get_target
from deploy.targets.base import Artifacts, Target, TargetOptions
from runtime import contract as C
from runtime.contract import RayPorts
from runtime.spec import ClusterSpec


@dataclass(frozen=True)
class Request:
    target: Target
    options: TargetOptions
    job: JobSpec
    spec: ClusterSpec
    spec_file: str
    spec_sha256: str


def make_request(target_name: str, flags: dict, spec: ClusterSpec, spec_file: str, spec_sha256: str,
                 images: dict[str, ImageInfo], job_values: dict, gpus: Optional[int], app_dir: Path,
                 build_dir: Path) -> Request:
    """Resolve the target, its options (its own defaults under BUILD_DIR first, then FLAGS) and the
    job; every problem found is reported together."""
    target = get_target(target_name)
    problems: list[str] = []
    options = None
    try:
        options = target.parse_options({**target.build_dir_options(build_dir), **flags})
    except PreflightError as e:
        problems += e.problems
    gpus_per_node = gpus if gpus is not None else target.spec_gpus(spec)
    info = None
    if target.needs_image:
        info = images.get(job_variant(gpus_per_node))
        if info is None:
            problems.append(f"image: no pushed {job_variant(gpus_per_node)} image recorded (build/images.json); "
                            f"run `{hint.cmd('build push')}` first")
    job = None
    try:
        job = make_job(**job_values, gpus_per_node=gpus_per_node, image=info.ref if info else None, image_info=info,
                       mounts=spec.mounts, fileroot=spec.fileroot, workdir=target.job_workdir(app_dir))
    except PreflightError as e:
        problems += e.problems
    if problems:
        raise PreflightError(problems)
    return Request(target, options, job, spec, spec_file, spec_sha256)


def common_problems(req: Request) -> list[str]:
    """What every target needs of the image and the ports."""
    job, opts, problems = req.job, req.options, []
    info = job.image_info
    if info is not None:
        if info.spec_sha256 != req.spec_sha256:
            problems.append(
                f"--spec {req.spec_file}: the image {job.image} was built with spec sha256 {info.spec_sha256[:12]} "
                f"({info.spec_file or 'another file'}), not this one (sha256 {req.spec_sha256[:12]}); the job would run "
                f"with the baked-in spec. Build and push with this spec, for the whole chain: "
                f"INVOKE_PROJECT_SPEC={req.spec_file} {hint.cmd('build push deploy --target ' + req.target.name)}")
        if req.target.pulls_from_registry(opts) and job.image.loopback and not req.target.allows_local_registry(opts):
            problems.append(
                f"image: {job.image} is in the loopback registry {job.image.registry}, which compute nodes cannot pull "
                f"from. Push to a registry they reach (INVOKE_REGISTRY_ADDRESS=host:port, or the spec's \"registry\"), "
                f"{req.target.unreachable_registry_fix}; --allow-local-registry if the nodes really are this machine")
    stride = req.target.port_stride(opts)
    try:
        RayPorts(job.port_base, (job.nodes - 1) * stride, ephemeral_low=C.PORTABLE_EPHEMERAL_LOW)
    except ValueError as e:
        problems.append(f"--port-base/--port-stride: {e}")
    return problems


def registry_problem(req: Request) -> Optional[str]:
    """At --submit, for a job whose nodes pull the image: does its registry serve the pinned manifest?
    (Writing files asks nothing: the nodes may reach a registry this machine does not.)"""
    info = req.job.image_info
    if not (req.options.submit and req.target.pulls_from_registry(req.options) and info):
        return None
    from deploy.registry import check
    return check.check(info.ref, info.registry_scheme)


def plan(req: Request, dry_run: bool = False) -> Artifacts:
    """The artifacts, once pre-flight found nothing; else PreflightError listing every problem (with
    DRY_RUN, carrying the artifacts as they would be, where they render, for the user to look at)."""
    problems = common_problems(req) + req.target.preflight(req.job, req.spec, req.options)
    if problems:
        raise _refused(req, problems, dry_run)
    site = req.target.site_check(req.job, req.spec, req.options)
    if site.problems:
        raise _refused(req, site.problems, dry_run)
    pulled = registry_problem(req)
    if pulled:
        raise _refused(req, [pulled], dry_run)
    try:
        artifacts = req.target.render(req.job, req.spec, req.options)
    except DeployError as e:
        raise PreflightError([str(e)]) from None
    artifacts.notes[:0] = site.notes
    info = req.job.image_info
    if info is not None and info.profile == C.SKYPILOT_PROFILE and req.target.name != C.SKYPILOT_PROFILE:
        artifacts.notes.append(f"the image has the SkyPilot profile (its user may become root with sudo); for "
                               f"--target {req.target.name} build without it: `{hint.cmd('build --profile default push')}`")
    return artifacts


def _refused(req: Request, problems: list[str], dry_run: bool) -> PreflightError:
    error = PreflightError(problems)
    if dry_run:
        try:
            error.artifacts = req.target.render(req.job, req.spec, req.options)
        except Exception:  # noqa: BLE001 - values pre-flight refused may not render; the problems say why
            error.artifacts = None
    return error

"""From one JobSpec to each target's files (the dry run), then the step that submits/applies.

    plan(request)    pre-flight checks + rendered files; pure except reading the engine for .sqsh names
    execute(plan)    writes the files all at once, then converts/submits/applies as asked
"""
from __future__ import annotations

import ipaddress
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml

from deploy import enroot, k8s, slurm
from deploy.artifacts import write_all
from deploy.job import DeployError, JobSpec
from runtime.spec import ClusterSpec, SlurmOptions

TARGETS = ("local", "slurm", "pyxis", "k8s")


def registry_host(repo_digest: str) -> str | None:
    """'host:5000/repo@sha256:..' -> 'host:5000'; None for Docker Hub style names."""
    first, _, rest = repo_digest.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost" or first.startswith("[")) else None


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass
class Request:
    target: str
    spec: ClusterSpec
    job: JobSpec
    out_dir: Path
    submit: bool = False
    seeds: list[int] = field(default_factory=list)
    slots: list[k8s.Slot] = field(default_factory=list)
    sqsh_dir: Optional[Path] = None       # pyxis: convert the image to .sqsh here and point srun at it
    sqsh_to_fileroot: bool = False        # ... and copy it to <fileroot>/images (the path srun then uses)
    port_stride: int = 0
    image_record: dict = field(default_factory=dict)  # build/images.json entry of the job's image
    spec_file: str = ""
    spec_sha256: str = ""
    partition: Optional[str] = None       # overrides slurm.partition
    account: Optional[str] = None         # overrides slurm.account
    allow_local_registry: bool = False    # the compute nodes are this machine: a loopback registry is fine
    allow_http_registry: bool = False     # pyxis: the site's enroot.conf has ENROOT_ALLOW_HTTP=yes

    @property
    def slurm_options(self) -> SlurmOptions:
        """The spec's slurm section (all optional: Slurm has a default partition), with the flag overrides."""
        opts = self.spec.slurm or SlurmOptions()
        update = {k: v for k, v in (("partition", self.partition), ("account", self.account)) if v}
        return opts.model_copy(update=update) if update else opts


@dataclass
class Plan:
    request: Request
    files: dict[str, str]
    modes: dict[str, int] = field(default_factory=dict)
    sqsh_path: Optional[Path] = None      # where the converted image goes (pyxis + sqsh)
    sqsh_ref: Optional[str] = None        # what srun is told
    notes: list[str] = field(default_factory=list)  # things the user should know; not errors

    def summary(self) -> dict:
        r = self.request
        return {"target": r.target, "job": r.job.model_dump(mode="json"), "out_dir": str(r.out_dir),
                "files": sorted(self.files), "sqsh": self.sqsh_ref, "notes": list(self.notes)}


def _image_problems(req: Request) -> list[str]:
    """The image must carry this spec, and (unless it travels as a .sqsh) be pullable by the nodes."""
    job, rec, problems = req.job, req.image_record, []
    if not job.image:
        return problems
    baked = rec.get("spec_sha256")
    if baked != req.spec_sha256:
        what = f"spec sha256 {baked[:12]} ({rec.get('spec_file') or 'another file'})" if baked else "an unrecorded spec"
        problems.append(
            f"--spec {req.spec_file}: the image {job.image} was built with {what}, not this one (sha256 "
            f"{req.spec_sha256[:12]}); the job would run with the baked-in spec. Build and push with this spec, for "
            f"the whole chain: INVOKE_PROJECT_SPEC={req.spec_file} invoke build push deploy --target {req.target}")
    if req.target not in ("pyxis", "k8s") or req.sqsh_dir:
        return problems
    host = registry_host(job.image)
    if host and is_loopback(host) and not req.allow_local_registry:
        fix = "or deploy with --sqsh (the image travels as a file)" if req.target == "pyxis" else \
            "or load the image on every node yourself"
        problems.append(
            f"image: {job.image} is in the loopback registry {host}, which compute nodes cannot pull from. Push to a "
            f"registry they reach (INVOKE_REGISTRY_ADDRESS=host:port, or the spec's \"registry\"), {fix}; "
            "--allow-local-registry if the nodes really are this machine")
    if req.target == "pyxis" and rec.get("registry_scheme") == "http" and not req.allow_http_registry:
        problems.append(
            f"image: the registry {host or rec.get('registry')} speaks plain HTTP; enroot refuses it unless the site's "
            "enroot.conf sets ENROOT_ALLOW_HTTP=yes (Pyxis strips ENROOT_* from the job's environment, so it cannot "
            "be set per job). Set it there and pass --allow-http-registry, use a TLS registry, or deploy with --sqsh")
    return problems


def preflight(req: Request) -> list[str]:
    """Every problem at once, before anything is written or waits in a queue; returns notes."""
    job, spec, problems, notes = req.job, req.spec, [], []
    if req.target not in TARGETS:
        problems.append(f"--target: {req.target!r} is not one of {', '.join(TARGETS)}")
    if req.target in ("slurm", "pyxis"):
        if not req.slurm_options.partition:
            notes.append("no partition given (slurm.partition or --partition): Slurm uses the cluster's default")
        if job.gpus_per_node and spec.slurm and spec.slurm.gpus_per_node and job.gpus_per_node != spec.slurm.gpus_per_node:
            problems.append(f"GPUs per node: the job asks for {job.gpus_per_node}, the spec's slurm.gpus_per_node is "
                            f"{spec.slurm.gpus_per_node}; make them agree")
    if req.target == "k8s":
        if spec.kubernetes is None:
            problems.append("kubernetes.namespace: the cluster spec has no 'kubernetes' section; add one with a namespace")
        k = spec.kubernetes
        if k and k.gpus_per_pod and job.gpus_per_node != k.gpus_per_pod:
            problems.append(f"GPUs per node: the job asks for {job.gpus_per_node}, the spec's kubernetes.gpus_per_pod "
                            f"is {k.gpus_per_pod}; make them agree")
        for s in req.slots:
            if s.gpu is not None and job.gpus_per_node > 1:
                problems.append(f"--slots {s.node}:{s.gpu}: a GPU slot gives one GPU but the job asks for "
                                f"{job.gpus_per_node} per node")
    elif req.seeds or req.slots:
        problems.append("--seeds/--slots: the multi-seed fan-out is for the k8s target")
    if req.target in ("pyxis", "k8s", "local") and not (job.image and "@sha256:" in job.image):
        problems.append(f"image: {job.image!r} is not pinned by digest; run `invoke build push` first")
    if req.target == "k8s" and job.image and job.uid is None:
        problems.append(f"image: {job.image} has no numeric USER recorded (build/images.json 'user': "
                        f"{req.image_record.get('user')!r}); a kubelet cannot verify runAsNonRoot. Build and push again")
    problems += _image_problems(req)
    if req.target == "slurm" and not req.slurm_options.env_setup:
        notes.append("slurm.env_setup is empty: the job runs `python -m runtime` from the environment sbatch "
                     "exports (activate the runtime's venv before submitting, or add env_setup lines)")
    if req.sqsh_dir and req.target != "pyxis":
        problems.append("--sqsh: only the pyxis target runs .sqsh images")
    if req.sqsh_to_fileroot and not req.sqsh_dir:
        problems.append("--sqsh-to-fileroot: only with --sqsh")
    if (req.partition or req.account) and req.target not in ("slurm", "pyxis"):
        problems.append("--partition/--account: only for the slurm and pyxis targets")
    if problems:
        raise DeployError("pre-flight failed, nothing was written:\n  - " + "\n  - ".join(problems))
    return notes


def plan(req: Request) -> Plan:
    notes = preflight(req)
    job, name = req.job, req.job.name
    if req.target == "local":
        return Plan(req, {}, notes=notes)
    if req.target == "k8s":
        objs = (k8s.render_seeds(job, req.spec.kubernetes, req.seeds, req.slots) if req.seeds
                else k8s.render(job, req.spec.kubernetes, slot=req.slots[0] if req.slots else None))
        return Plan(req, {f"{name}.yaml": k8s.dump(objs)}, notes=notes)
    image, sqsh_path = None, None
    if req.target == "pyxis":
        if req.sqsh_dir:
            repo, digest = job.image.split("@", 1)
            sqsh_path = Path(req.sqsh_dir).resolve() / enroot.sqsh_name(repo, digest)
            where = Path(job.fileroot) / "images" / sqsh_path.name if req.sqsh_to_fileroot else sqsh_path
            image = slurm.squashfs_ref(str(where))
        else:
            image = slurm.pyxis_image(job.image)
    script = slurm.render(job, req.slurm_options, image, port_stride=req.port_stride)
    return Plan(req, {f"{name}.sbatch": script}, {f"{name}.sbatch": 0o755}, sqsh_path, image, notes)


def execute(p: Plan, client_factory: Callable, progress: Callable[[str], None]) -> dict:
    req = p.request
    out = p.summary()
    if req.target == "local":
        from deploy import local
        client = client_factory()
        try:
            client.images.get(req.job.image)
        except Exception:
            progress(f"pulling {req.job.image}")
            client.images.pull(req.job.image)
        progress(f"local: {req.job.nodes} node(s) of {req.job.image}")
        out["exit_code"] = local.run(client, req.job)
        return out
    if p.sqsh_path:
        repo, digest = req.job.image.split("@", 1)
        res = enroot.convert(client_factory(), req.job.image, p.sqsh_path.parent, digest=digest, progress=progress)
        progress(f"squashfs {'reused' if res.cached else 'written'}: {res.path} ({res.seconds:.1f}s)")
        if req.sqsh_to_fileroot:
            dest = Path(p.sqsh_ref)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.partial")
                shutil.copyfile(res.path, tmp)
                tmp.replace(dest)
            progress(f"squashfs at {dest}")
    written = write_all(req.out_dir, p.files, p.modes)
    out["written"] = [str(w) for w in written]
    for w in written:
        progress(f"wrote {w}")
    if req.submit and req.target in ("slurm", "pyxis"):
        out["slurm_job_id"] = slurm.submit(written[0], req.job)
        progress(f"submitted: Slurm job {out['slurm_job_id']}; output in {slurm.log_dir(req.job)}")
    elif req.submit and req.target == "k8s":
        objs = list(yaml.safe_load_all(p.files[f"{req.job.name}.yaml"]))
        out["kubectl"] = k8s.launch(objs, req.spec.kubernetes.namespace, lambda: secrets.token_hex(32))
        progress(f"applied {len(objs)} object(s); remove them with `invoke destroy --name {req.job.name}`")
    return out

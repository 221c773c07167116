"""`--target pyxis`: the sbatch script with Pyxis' container flags on each srun.

The image comes from its registry (`registry#repo@digest`) or, with `--sqsh`, from an enroot
squashfs made here (cached by digest) and optionally copied to `<fileroot>/images/`. Compute
nodes pull from the registry themselves, so a loopback registry is a pre-flight problem unless
`--allow-local-registry`; a plain-HTTP one needs the site's ENROOT_ALLOW_HTTP (`--allow-http-registry`).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from pydantic import Field

from deploy.targets.pyxis.sqsh import convert as convert_to_sqsh
from deploy.targets.slurm import sbatch
from deploy.targets.base import AllowLocalRegistry, Applied, ApplyContext, Artifacts, File
from deploy.targets.slurm import (SlurmFlags, SlurmJobTarget, partition_account, slurm_notes, slurm_problems,
                                  spec_section, submit)
from deploy.job import JobSpec
from runtime.spec import ClusterSpec


class PyxisFlags(SlurmFlags):
    """pyxis' options: slurm's and these; each description is its flag's help."""
    sqsh: bool = Field(False, description=(
        "convert the image to an enroot .sqsh (cached by digest in build/sqsh) and run from that file. The "
        "first conversion squashes the deps/base layers once (a minute or two); after a code change only the "
        "app and spec layers are appended (seconds)."))
    sqsh_to_fileroot: bool = Field(False, description=(
        "with --sqsh, also copy the .sqsh to <fileroot>/images/ and point srun at that copy."))
    allow_local_registry: AllowLocalRegistry
    allow_http_registry: bool = Field(False, description=(
        "accept a plain-HTTP registry (the site's enroot.conf has ENROOT_ALLOW_HTTP=yes)."))
    # not a flag: Pyxis.build_dir_options sets it (<build_dir>/sqsh)
    sqsh_dir: Optional[str] = Field(None, description="where .sqsh files are made and cached",
                                    json_schema_extra={"cli": False})


def sqsh_paths(job: JobSpec, opts: PyxisFlags) -> tuple[Path, str]:
    """(where the .sqsh is made here, what srun is told)."""
    local = Path(opts.sqsh_dir or "build/sqsh").resolve() / job.image.sqsh_name()
    where = Path(job.fileroot) / "images" / local.name if opts.sqsh_to_fileroot else local
    return local, sbatch.squashfs_ref(str(where))


class Pyxis(SlurmJobTarget):
    name = "pyxis"
    summary = "sbatch with srun --container-image (Pyxis + enroot): from the registry digest or an enroot .sqsh"
    Options = PyxisFlags
    pulls_image = True
    unreachable_registry_fix = "or deploy with --sqsh (the image travels as a file)"

    def pulls_from_registry(self, opts: PyxisFlags) -> bool:
        return not opts.sqsh

    def allows_local_registry(self, opts: PyxisFlags) -> bool:
        return opts.allow_local_registry

    def build_dir_options(self, build_dir: Path) -> dict:
        return {"sqsh_dir": str(build_dir / "sqsh")}

    def spec_gpus(self, spec: ClusterSpec) -> int:
        return spec_section(spec).gpus_per_node

    def preflight(self, job, spec, opts: PyxisFlags) -> list[str]:
        problems = slurm_problems(job, spec, opts)
        if opts.sqsh_to_fileroot and not opts.sqsh:
            problems.append("--sqsh-to-fileroot: only with --sqsh")
        info = job.image_info
        if (not opts.sqsh and info and info.registry_scheme == "http" and not opts.allow_http_registry):
            problems.append(
                f"image: the registry {job.image.registry} speaks plain HTTP; enroot refuses it unless the site's "
                "enroot.conf sets ENROOT_ALLOW_HTTP=yes (Pyxis strips ENROOT_* from the job's environment, so it "
                "cannot be set per job). Set it there and pass --allow-http-registry, use a TLS registry, or --sqsh")
        return problems

    def render(self, job: JobSpec, spec: ClusterSpec, opts: PyxisFlags) -> Artifacts:
        partition, account = partition_account(spec, opts)
        extra = {}
        if opts.sqsh:
            local, image = sqsh_paths(job, opts)
            extra = {"sqsh_path": local, "sqsh_ref": image}
        else:
            image = job.image.pyxis()
        script = sbatch.render(job, partition=partition, account=account, image=image, port_stride=opts.port_stride,
                               spare_nodes=opts.spare_nodes)
        return Artifacts({f"{job.name}.sbatch": File(script, 0o755)}, [script], slurm_notes(job, spec, opts), extra)

    def apply(self, artifacts: Artifacts, job: JobSpec, spec, opts: PyxisFlags, ctx: ApplyContext) -> Applied:
        made = None
        if opts.sqsh:
            local: Path = artifacts.extra["sqsh_path"]
            res = convert_to_sqsh(ctx.engine, job.image.docker(), local.parent, digest=job.image.digest,
                                 progress=ctx.progress, layer_store=ctx.layer_store,
                                 from_build=ctx.from_build)
            ctx.progress(f"squashfs {'reused' if res.cached else f'written ({res.how})'}: {res.path} "
                         f"({res.seconds:.1f}s)")
            made = str(res.path)
            if opts.sqsh_to_fileroot:
                dest = Path(artifacts.extra["sqsh_ref"])
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(f".{dest.name}.partial")
                    shutil.copyfile(res.path, tmp)
                    tmp.replace(dest)
                ctx.progress(f"squashfs at {dest}")
                made = str(dest)
        applied = submit(artifacts, job, ctx, container=True) if opts.submit else super().apply(artifacts, job, spec,
                                                                                                 opts, ctx)
        return applied.model_copy(update={"sqsh": made})


TARGET = Pyxis()

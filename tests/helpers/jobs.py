"""JobSpecs for renderer tests, with the image record deploy gets from build/images.json."""
from __future__ import annotations

from deploy.job import ImageInfo, JobSpec
from runtime.imageref import ImageRef

DIGEST = "registry.example.com:5000/raytrain-gpu@sha256:" + "ab" * 32


def info(ref: str = DIGEST, spec_sha256: str = "0" * 64, user: str = "1000:1000", scheme: str = "https",
         profile: str = "default") -> ImageInfo:
    return ImageInfo(ref=ImageRef.parse(ref), spec_sha256=spec_sha256, spec_file="cluster_specs/x.json", user=user,
                     registry_scheme=scheme, profile=profile)


def job(image: str | None = DIGEST, profile: str = "default", **kw) -> JobSpec:
    values = dict(name="job", nodes=3, cpus_per_node=2, command=["python", "train.py"])
    values.update(kw)
    if image:
        values.setdefault("image_info", info(image, profile=profile))
        values["image"] = values["image_info"].ref
    return JobSpec(**values)

"""--seeds, the option k8s and skypilot share: one definition of the flag, its parsing and its pre-flight,
so the two targets' flags and refusals agree."""
from __future__ import annotations

from typing import Annotated, Callable

from pydantic import BeforeValidator, Field

from deploy import hint
from deploy.job import DeployError, JobSpec
from runtime import numbers

MAX_SEEDS = 1000
MAX_SEED_NAME = 47  # <name>-s<seed>: the longest object name both targets derive from it fits


def parse_seeds(text: str) -> list[int]:
    """'1-4', '1,5,9' or '1-3 7' -> seeds, at most MAX_SEEDS of them, each 0..2**31-1."""
    out: list[int] = []
    for w in (x for x in text.replace(",", " ").split() if x):
        lo, dash, hi = w.partition("-")
        if not (numbers.is_whole(lo) and (not dash or numbers.is_whole(hi))) or len(w) > 21:
            raise DeployError(f"--seeds: {w[:40]!r} is not a whole number or a range like 1-8")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a > b or b >= 2**31:
            raise DeployError(f"--seeds: {w!r} is not an increasing range of seeds below 2**31")
        if len(out) + (b - a + 1) > MAX_SEEDS:
            raise DeployError(f"--seeds: more than {MAX_SEEDS} runs; split the sweep into several deploys")
        out += range(a, b + 1)
    if not out:
        raise DeployError("--seeds: no seed given")
    return out


def from_text(parse: Callable[[str], list]) -> BeforeValidator:
    """A list flag's text becomes the list here, and only here; a list is taken as it is."""
    return BeforeValidator(lambda v: parse(v) if isinstance(v, str) else v)


Seeds = Annotated[list[int], from_text(parse_seeds), Field(default_factory=list, max_length=MAX_SEEDS, description=(
    "one independent run per seed, e.g. '1-4' or '1,5,9' (<name>-s<seed>; --seed is appended)."))]


def seeds_problems(job: JobSpec, seeds: list[int]) -> list[str]:
    """What a seed fan-out cannot do with this job."""
    problems = []
    if seeds and job.serve:
        problems.append(f"--seeds: a held cluster ({hint.cmd('up')}) is one cluster; fan seeds out with `{hint.cmd('deploy')}`")
    if seeds and len(f"{job.name}-s{max(seeds)}") > MAX_SEED_NAME:
        problems.append(f"--name {job.name!r}: too long for the seed runs' object names; use a shorter name")
    return problems

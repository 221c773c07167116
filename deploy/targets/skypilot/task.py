"""SkyPilot task files, as the skypilot target and its held clusters (deploy/targets/skypilot/held.py) write them:
the YAML form, and the `run:` script that gives each node its part by SKYPILOT_NODE_RANK.

SkyPilot ranks a job's nodes in the cluster's own order, the head first, so rank 0 of a task over
every node is the cluster's head whatever the job: the held job's head launcher and a later run's
step on rank 0 meet on the same node (and, with a docker image, in the same container).
"""
from __future__ import annotations

import shlex
from typing import Optional

import yaml

from deploy.yaml_out import Dumper
from runtime import contract as C

# SkyPilot starts its Ray, and so every task, with `env -u PYTHONPATH` (sky/skylet/constants.py,
# SKY_UNSET_PYTHONPATH_AND_SET_CWD): a task of the image sets the image's own again, or `python -m
# runtime` is not found (seen on a real SkyPilot 0.14.1 on Kubernetes). A job's own envs win over it.
IMAGE_ENV = {"PYTHONPATH": C.IMAGE_PYTHONPATH}


def by_rank(head: list[str], others: Optional[list[str]] = None, cd: Optional[str] = None,
            stdin: Optional[str] = None) -> str:
    """The `run:` section: HEAD on rank 0 (its stdin from the file STDIN, a path relative to the
    task's working directory), OTHERS elsewhere (None: the other nodes have nothing to do and end
    with 0); every token quoted."""
    first = f"{shlex.join(['cd', cd])} || exit 1\n" if cd else ""  # SkyPilot starts in ~/sky_workdir
    redirect = f" < {shlex.quote(stdin)}" if stdin else ""
    rest = f"else\n  exec {shlex.join(others)}\n" if others is not None else ""
    return (f"{first}if [ \"${{SKYPILOT_NODE_RANK}}\" = 0 ]; then\n"
            f"  exec {shlex.join(head)}{redirect}\n"
            f"{rest}fi\n")


class _TaskDumper(Dumper):
    """Multi-line strings (the run script) as literal blocks where YAML allows it; the emitter falls
    back to quoting by itself for strings a block cannot hold (trailing spaces, control characters)."""


_TaskDumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def dump(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_TaskDumper, sort_keys=False, default_flow_style=False)

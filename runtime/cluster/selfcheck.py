"""Self-check run inside an image: proves the dependency, app and spec layers are usable."""
from __future__ import annotations

import getpass
import json
import os
import sys

from runtime.contract import SPEC_PATH
from runtime.spec import SpecError, load_spec


def _user_name() -> str | None:
    """The login name, or None for a uid with no passwd entry and no USER/LOGNAME (enroot and
    Kubernetes run images as arbitrary uids)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def report() -> dict:
    import ray
    import torch

    spec_path = os.environ.get(SPEC_PATH)
    out = {
        "python": sys.version.split()[0],
        "ray": ray.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "user": _user_name(),
        "uid": os.getuid(),
        "cluster_spec_path": spec_path,
        "cluster_name": None,
    }
    if spec_path:
        out["cluster_name"] = load_spec(spec_path).cluster_name
    return out


def run(require_cuda: bool = False) -> int:
    try:
        rep = report()
    except SpecError as e:
        print(f"selfcheck: {e}", file=sys.stderr)
        return 1
    print(json.dumps(rep, sort_keys=True))
    if require_cuda and not rep["torch_cuda"]:
        print("selfcheck: torch is not a CUDA build", file=sys.stderr)
        return 1
    if not rep["cluster_spec_path"]:
        print("selfcheck: CLUSTER_SPEC_PATH is not set", file=sys.stderr)
        return 1
    return 0

"""A scheduler's command-line tool run from the login side (sbatch, squeue, srun, scancel, kubectl,
sky): the one place that says a tool is missing or did not finish, each with what to do."""
from __future__ import annotations

import subprocess
from typing import Optional

from deploy.job import DeployError


def not_on_path(tool: str, fix: str) -> DeployError:
    return DeployError(f"{tool} is not on PATH: {fix}")


def run(argv: list[str], fix: str, env: Optional[dict] = None, timeout_s: float = 60, stdin: Optional[str] = None,
        slow: str = "") -> subprocess.CompletedProcess:
    """ARGV's completed process (text, both streams captured). FIX: what to do when the tool is not
    installed; SLOW: what to check when it does not finish in TIMEOUT_S."""
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError:
        raise not_on_path(argv[0], fix) from None
    except subprocess.TimeoutExpired:
        raise DeployError(f"`{' '.join(argv[:3])} ...` did not finish in {timeout_s:g} s"
                          + (f"; {slow}" if slow else "")) from None

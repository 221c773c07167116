"""A scheduler's command-line tool run from the login side (sbatch, squeue, srun, scancel, kubectl,
sky): the one place that says a tool is missing or did not finish, each with what to do."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from deploy.job import DeployError


def resolve(tool: str, env: Optional[dict] = None) -> str:
    """TOOL as it will be run: as given when PATH (ENV's, else this process's) has it; else the one beside
    this Python, where a tool installed into the toolchain's own venv lives (`.venv/bin/sky`, from the
    `skypilot` extra), so that it runs whether or not the venv is activated."""
    if os.sep in tool or shutil.which(tool, path=(env if env is not None else os.environ).get("PATH", os.defpath)):
        return tool
    beside = Path(sys.executable).parent / tool
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else tool


def not_on_path(tool: str, fix: str) -> DeployError:
    return DeployError(f"{tool} is not on PATH: {fix}")


def run(argv: list[str], fix: str, env: Optional[dict] = None, timeout_s: float = 60, stdin: Optional[str] = None,
        slow: str = "") -> subprocess.CompletedProcess:
    """ARGV's completed process (text, both streams captured). FIX: what to do when the tool is not
    installed; SLOW: what to check when it does not finish in TIMEOUT_S."""
    argv = [resolve(argv[0], env), *argv[1:]]
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError:
        raise not_on_path(os.path.basename(argv[0]), fix) from None
    except subprocess.TimeoutExpired:
        raise DeployError(f"`{' '.join(argv[:3])} ...` did not finish in {timeout_s:g} s"
                          + (f"; {slow}" if slow else "")) from None

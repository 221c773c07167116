"""Write a set of artifact files all at once, or none of them."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from deploy.job import DeployError


def write_all(out_dir: Path, files: dict[str, str], modes: dict[str, int] | None = None) -> list[Path]:
    """Write every file to a scratch directory beside OUT_DIR, then move each into place.

    A failure while writing (bad name, full disk) leaves OUT_DIR as it was; the final moves are
    renames on one filesystem.
    """
    for name in files:
        if "/" in name or name.startswith(".") or "\x00" in name:
            raise DeployError(f"artifact name {name!r} must be a plain file name")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DeployError(f"--out {out_dir}: exists and is not a directory; give a directory (it is created if missing)")
    umask = os.umask(0)
    os.umask(umask)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, text in files.items():
            p = scratch / name
            p.write_text(text)
            p.chmod((modes or {}).get(name, 0o644) & ~umask)  # as any file the user creates
        out_dir.mkdir(exist_ok=True)
        written = []
        for name in files:
            os.replace(scratch / name, out_dir / name)
            written.append(out_dir / name)
        return written
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

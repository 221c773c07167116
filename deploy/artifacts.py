"""Write a set of artifact files all at once, or none of them."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from deploy.job import DeployError
from runtime.errors import os_message


def write_all(out_dir: Path, files: dict[str, str], modes: dict[str, int] | None = None) -> list[Path]:
    """Write every file to a scratch directory beside OUT_DIR, then move each into place.

    A failure while writing (bad name, full disk) leaves OUT_DIR as it was; the final moves are
    renames on one filesystem.
    """
    for name in files:
        if "/" in name or name.startswith(".") or "\x00" in name:
            raise DeployError(f"artifact name {name!r} must be a plain file name")
    out_dir = Path(out_dir)
    try:
        return _write_all(out_dir, files, modes or {})
    except OSError as e:  # /proc, a read-only mount, a long name, a file on the path, a full disk
        raise DeployError(f"--out {out_dir}: cannot write the artifacts there: "
                          f"{os_message(e, where=_name_in(e, out_dir))}; nothing was written") from None


def _name_in(e: OSError, out_dir: Path) -> str:
    """The failing path as the user knows it: the artifact's name, not the scratch directory's."""
    target = e.filename2 if e.filename2 is not None else e.filename
    return Path(str(target)).name if target is not None and Path(str(target)).parent == out_dir else str(out_dir)


def _write_all(out_dir: Path, files: dict[str, str], modes: dict[str, int]) -> list[Path]:
    if out_dir.exists() and not out_dir.is_dir():
        raise DeployError(f"--out {out_dir}: exists and is not a directory; give a directory (it is created if missing)")
    for parent in out_dir.parents:
        if parent.exists() and not parent.is_dir():
            raise DeployError(f"--out {out_dir}: {parent} is a file, not a directory; give a directory path")
    for name in files:  # checked before anything is written, so a failed move cannot leave half a set
        if (out_dir / name).is_dir():
            raise DeployError(f"--out {out_dir}: {name} there is a directory; remove it or give another --out")
    umask = os.umask(0)
    os.umask(umask)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:100]}.", dir=out_dir.parent))
    try:
        for name, text in files.items():
            p = scratch / name
            p.write_text(text)
            p.chmod(modes.get(name, 0o644) & ~umask)  # as any file the user creates
        out_dir.mkdir(exist_ok=True)
        written = []
        for name in files:
            os.replace(scratch / name, out_dir / name)
            written.append(out_dir / name)
        return written
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

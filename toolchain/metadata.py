"""build/images.json: one entry per variant, written only for images that fully pushed."""
from __future__ import annotations

import json
import os
from pathlib import Path


def images_file(build_dir: Path) -> Path:
    return build_dir / "images.json"


def read_images(build_dir: Path) -> dict:
    path = images_file(build_dir)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def record_image(build_dir: Path, variant: str, entry: dict) -> Path:
    """Merge one variant's entry atomically (a crash leaves the old file, never half a file)."""
    path = images_file(build_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_images(build_dir)
    data[variant] = entry
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_build(build_dir: Path) -> dict:
    path = build_dir / "build.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text())

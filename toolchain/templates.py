"""Dockerfile templates under dockerfiles/, rendered with StrictUndefined (a missing value is an error)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2

DOCKERFILES = Path(__file__).resolve().parent.parent / "dockerfiles"
_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(DOCKERFILES)),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)


def render(name: str, **values: object) -> str:
    return _env.get_template(name).render(**values)


def template_hash(name: str) -> str:
    return hashlib.sha256((DOCKERFILES / name).read_bytes()).hexdigest()

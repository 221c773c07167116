"""Dockerfile templates (dockerfiles/, shipped as toolchain/assets), rendered with StrictUndefined (a
missing value is an error)."""
from __future__ import annotations

import hashlib

import jinja2

from toolchain import assets

DOCKERFILES = assets.path("dockerfiles")
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

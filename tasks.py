"""Plain `invoke` in a checkout of the toolchain: the packaged task collection (toolchain/tasks.py).

`raytrain` is the same collection from any project; here, under plain Invoke, the project's own
settings ([tool.raytrain] of pyproject.toml, or raytrain.yaml) are the collection's configuration, so
Invoke's system and user files (/etc/invoke.yaml, ~/.invoke.yaml) come above them.
"""
from toolchain.tasks import ns, under_plain_invoke

under_plain_invoke(ns)

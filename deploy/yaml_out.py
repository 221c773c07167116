"""The YAML the targets write (Kubernetes manifests, SkyPilot tasks): every value is data, quoted as
YAML needs, never a template."""
from __future__ import annotations

import yaml

_BASE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class Dumper(_BASE_DUMPER):  # type: ignore[misc,valid-type]
    """libyaml's safe dumper when PyYAML has it (~10x faster, same rules); never anchors or aliases:
    objects that share a dict (labels and selectors) are written out in full, as people read and diff them."""

    def ignore_aliases(self, data) -> bool:
        return True

    def resolve(self, kind, value, implicit):
        # the emitter asks, for every scalar, which tag its plain text would read back as; a fan-out
        # repeats the same few hundred values thousands of times, so the answers are memoised
        if kind is not yaml.ScalarNode:
            return _BASE_DUMPER.resolve(self, kind, value, implicit)
        key = (value, tuple(implicit))
        if key not in _RESOLVED:
            if len(_RESOLVED) > 100_000:
                _RESOLVED.clear()
            _RESOLVED[key] = _BASE_DUMPER.resolve(self, kind, value, implicit)
        return _RESOLVED[key]


_RESOLVED: dict = {}

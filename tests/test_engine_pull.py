"""deploy/engine_pull.py: the pushed image pulled into the real engine from the real registry, its progress said,
and a digest the registry lacks one error naming the image."""
from __future__ import annotations

import os
import re

import pytest

from conftest import SESSION
from deploy.engine_pull import PullError, pull
from test_registry_build import _push_tiny_base


def test_a_pushed_image_is_pulled_with_its_progress_and_a_missing_one_is_one_error(client, registry, settings):
    ref = _push_tiny_base(settings.registry.address, f"{SESSION}-pulled", {"etc/hello": os.urandom(1 << 20)})
    lines: list[str] = []
    try:
        pull(client, ref, lines.append, every_s=0)
        image = client.images.get(ref)
        assert image.attrs["RootFS"]["Layers"] and lines[0].startswith(f"pulling {ref} into the engine")
        assert lines[-1].startswith(f"pulled {ref}: ") and "of layers downloaded" in lines[-1], lines
        said = [l for l in lines[1:-1] if re.fullmatch(r"pulling: [0-9.]+ MiB of [0-9.]+ MiB of layers downloaded, "
                                                       r"[0-9.]+ MiB extracted \([0-9]+s\)", l)]
        assert said and said[-1].startswith("pulling: 1.0 MiB of 1.0 MiB"), lines  # the 1 MiB layer, as it came
    finally:
        client.images.remove(ref, force=True)
    missing = ref.rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    with pytest.raises(PullError, match=f"pulling {missing} into the engine failed: .*docker login"):
        pull(client, missing, lines.append)

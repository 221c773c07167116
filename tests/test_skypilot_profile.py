"""The SkyPilot image profile (`build --profile skypilot`), checked by SkyPilot's own pod setup code:
the package list and presence test of its Kubernetes pod template, its sudo test and its uv command,
all read from the installed SkyPilot and run in the image as its user. The default image stays
without sudo, and the profile's image shares every layer of it."""
import re
from pathlib import Path

import pytest

from runtime.contract import PROFILE_LABEL, SKYPILOT_PROFILE
from toolchain import pipeline
from toolchain.progress import Reporter

from conftest import SPEC, make_settings, run_in

sky = pytest.importorskip("sky")
from sky.skylet import constants as sky_constants  # noqa: E402  (after the skip: a dev dependency)

TEMPLATE = Path(sky.__file__).parent / "templates" / "kubernetes-ray.yml.j2"


@pytest.fixture(scope="module")
def profile_image(client, built, session_dir, app_dir):
    """The cpu image with the SkyPilot profile, built in a build directory of its own (the session's
    build.json keeps the default images the other tests push)."""
    settings = make_settings(session_dir / "profile", app_dir)
    return pipeline.build(settings, str(SPEC), "cpu", Reporter(), profile=SKYPILOT_PROFILE)["images"]["cpu"]


def skypilot_checks() -> str:
    """A bash script of SkyPilot's own checks: `missing NAME` for each package its pod setup would
    install with apt, `sudo-ok` when its sudo test passes, then its uv command's version."""
    text = TEMPLATE.read_text()
    packages = re.search(r'^\s*PACKAGES="([^"]+)";', text, re.M).group(1)
    present = re.search(r"^( *)pkg_present\(\) \{\n.*?^\1\}\n", text, re.S | re.M).group(0)
    sudo = re.search(r"timeout 2 sudo -l >/dev/null 2>&1", text).group(0)
    return (f"{present}for p in {packages}; do pkg_present \"$p\" || echo \"missing $p\"; done\n"
            f"{sudo} && echo sudo-ok\n{sky_constants.SKY_UV_CMD} -V || echo no-uv\n")


def test_skypilots_pod_setup_finds_everything_it_would_install(client, profile_image):
    out = run_in(client, profile_image["local_ref"], ["bash", "-c", skypilot_checks()])
    assert "missing" not in out, out
    assert "sudo-ok" in out and "uv 0.13.9" in out, out
    assert run_in(client, profile_image["local_ref"], ["sudo", "-n", "id", "-u"]).strip() == "0"


def test_only_the_profile_lets_the_user_become_root(client, built):
    out = run_in(client, built["cpu"]["local_ref"], ["bash", "-c", skypilot_checks()])
    assert "missing sudo" not in out  # sudo is not in SkyPilot's list: its absence shows in the sudo test
    assert "sudo-ok" not in out and "missing curl" in out and "missing openssh-server" in out and "no-uv" in out
    assert run_in(client, built["cpu"]["local_ref"], ["bash", "-c", "id -u; command -v sudo su || true"]).split() \
        == ["1000", "/usr/bin/su"]
    assert "Authentication failure" in run_in(client, built["cpu"]["local_ref"],
                                              ["bash", "-c", "su -c id root </dev/null 2>&1 || true"])


def test_the_profile_is_the_default_image_plus_its_own_layers(client, built, profile_image):
    default = client.images.get(built["cpu"]["local_ref"]).attrs
    profile = client.images.get(profile_image["local_ref"]).attrs
    below = default["RootFS"]["Layers"]
    assert profile["RootFS"]["Layers"][:len(below)] == below and len(profile["RootFS"]["Layers"]) == len(below) + 2
    assert profile["Config"]["Labels"][PROFILE_LABEL] == SKYPILOT_PROFILE
    assert PROFILE_LABEL not in (default["Config"]["Labels"] or {})
    assert profile["Config"]["User"] == default["Config"]["User"] == "1000:1000"
    assert profile_image["human_ref"].endswith("-skypilot")

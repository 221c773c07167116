"""The .sqsh converter against real Docker, mksquashfs and unsquashfs; then the image is booted.

A small image (on the bootstrapped base) carries every config field enroot reads; the format
contract is checked on it. The cpu image, converted with the same code, is unpacked and its
/etc/rc run under chroot to execute the runtime's self-check.
"""
import io
import json
import shutil
import subprocess
import tarfile
import uuid

import pytest

from deploy import enroot
from toolchain.bootstrap import ensure_base
from toolchain.progress import Reporter

CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def names_in_export(client, image_id: str) -> set:
    with enroot.exported(client, image_id) as chunks:
        stream = io.BufferedReader(enroot._ChunkReader(chunks), buffer_size=1 << 20)
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            return {m.name.rstrip("/").removeprefix("./") for m in tf}


def sqsh_listing(path) -> dict:
    """name -> (owner, mode) from `unsquashfs -lln` (numeric owners)."""
    out = subprocess.run(["unsquashfs", "-lln", "-d", "", str(path)], capture_output=True, text=True, check=True).stdout
    entries = {}
    for line in out.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[0][0] in "-dlcbps":
            name = parts[5].split(" -> ")[0].lstrip("/")
            if name:
                entries[name] = (parts[1], parts[0])
    return entries


def read_member(path, member) -> str:
    res = subprocess.run(["unsquashfs", "-cat", str(path), member], capture_output=True, text=True, check=True)
    return res.stdout


@pytest.fixture(scope="module")
def small_image(client, settings):
    base = ensure_base(client, settings, Reporter(quiet=True)).ref
    marker = uuid.uuid4().hex[:8]
    dockerfile = f"""FROM {base}
LABEL io.raytrain.test="{marker}"
ENV GREETING="hello world" RAYTRAIN_MARK={marker}
RUN mkdir -p /srv/app && echo hi > /srv/app/owned && chown 1000:1000 /srv/app/owned && touch /.dockerenv
WORKDIR /srv/app
VOLUME /data
ENTRYPOINT ["/bin/echo", "it's"]
CMD ["a", "$HOME"]
"""
    img, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"raytrain-sqsh-test:{marker}", rm=True)
    yield img
    client.images.remove(img.id, force=True)


@pytest.mark.parametrize("stream", [True, False], ids=["sqfstar-stream", "extract-mksquashfs"])
def test_format_contract(client, small_image, tmp_path, stream):
    res = enroot.convert(client, small_image.tags[0], tmp_path, stream=stream)
    assert not res.cached and res.path.name.endswith(small_image.id.replace(":", "-") + ".sqsh")
    stats = subprocess.run(["unsquashfs", "-s", str(res.path)], capture_output=True, text=True, check=True).stdout
    assert "Compression lzo" in stats
    listing = sqsh_listing(res.path)
    exported = names_in_export(client, small_image.id)
    expected = {n for n in exported if n and not n.startswith("dev/") and n != ".dockerenv"}
    expected |= {"etc/rc", "etc/rc.local", "etc/environment", "etc/fstab"}
    assert set(listing) == expected
    assert {owner for owner, _ in listing.values()} == {"0/0"}
    env = read_member(res.path, "etc/environment").splitlines()
    assert "GREETING=hello world" in env and any(l.startswith("PATH=") for l in env)
    assert read_member(res.path, "etc/fstab") == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    rc = read_member(res.path, "etc/rc")
    assert f"# io.raytrain.test {small_image.labels['io.raytrain.test']}" in rc
    assert "cd /srv/app && unset OLDPWD || exit 1" in rc
    assert "exec /bin/echo 'it'\"'\"'s' \"$@\"" in rc and "exec /bin/echo 'it'\"'\"'s' a '$HOME'" in rc

    # the rc script does what enroot start would: default command, then a given one
    tree = tmp_path / "tree"
    subprocess.run(["unsquashfs", "-q", "-d", str(tree), str(res.path)], check=True, capture_output=True)
    out = subprocess.run([CHROOT, str(tree), "/bin/sh", "/etc/rc"], capture_output=True, text=True, env={}).stdout
    assert out == "it's a $HOME\n"
    out = subprocess.run([CHROOT, str(tree), "/bin/sh", "/etc/rc", "pwd:", "$(x)"], capture_output=True, text=True).stdout
    assert out == "it's pwd: $(x)\n"

    again = enroot.convert(client, small_image.tags[0], tmp_path)
    assert again.cached and again.path == res.path and again.seconds < 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work dirs left behind


def test_cpu_image_boots_from_sqsh_and_passes_selfcheck(client, built, tmp_path):
    image = built["cpu"]["local_ref"]
    res = enroot.convert(client, image, tmp_path, progress=print)
    tree = tmp_path / "tree"
    subprocess.run(["unsquashfs", "-q", "-d", str(tree), str(res.path)], check=True, capture_output=True)
    env = dict(l.split("=", 1) for l in (tree / "etc" / "environment").read_text().splitlines() if "=" in l)
    # as enroot starts a container: /dev and /proc mounted in (they are not in the image), then /etc/rc
    # as an unprivileged user (the image's, uid 1000) in a private mount namespace
    boot = ('mount --rbind /dev "$1/dev" && mount -t proc proc "$1/proc" && '
            f'exec {CHROOT} --userspec=1000:1000 "$1" /bin/sh /etc/rc python -m runtime selfcheck')
    proc = subprocess.run(["unshare", "--mount", "--fork", "/bin/sh", "-c", boot, "boot", str(tree)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cluster_spec_path"] == env["CLUSTER_SPEC_PATH"] and report["cluster_name"]
    assert report["torch"].startswith("2.9.1") and report["ray"] == "2.60.0"
    assert report["uid"] == 1000

"""A small image full of the cases enroot's import handles specially, and the facts of a .sqsh.

The image is made from a tar with `docker import` (no base image, no build step), so it is the
same on every machine. `facts()` reads what matters of a squashfs: superblock options, the
listing (type, mode, owner, symlink target) and the four enroot configuration files.

Recording (by hand, where a real enroot is installed; see README "What ran on real components"):
    .venv/bin/python tests/helpers/enroot_fixture.py build
    enroot import -o /tmp/fixture.sqsh dockerd://raytrain-enroot-fixture:1
    .venv/bin/python tests/helpers/enroot_fixture.py facts /tmp/fixture.sqsh > tests/data/enroot_import_facts.json
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

TAG = "raytrain-enroot-fixture:1"
MTIME = 1_700_000_000
NON_ASCII = "NetLock_Arany_=Class_Gold=_Főtanúsítvány"
CHANGES = [
    "ENV GREETING=\"hello world\"",
    "ENV PATH=/opt/venv/bin:/usr/bin:/bin",
    "LABEL org.example.title=fixture",
    "LABEL org.example.multi=\"line one\"",
    "WORKDIR /srv/app",
    "VOLUME /data",
    'ENTRYPOINT ["/bin/echo", "it\'s"]',
    'CMD ["a", "$HOME"]',
    "USER 1000:1000",
]
DEEP = [f"d{i}" for i in range(1, 18)]  # directories deeper than enroot's u+w fix-up reaches (15)


def _entries() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []

    def add(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, data: bytes | None = None,
            link: str = "", uid: int = 0) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime, info.uid, info.gid, info.linkname = kind, mode, MTIME, uid, uid, link
        if kind == tarfile.REGTYPE:
            data = data or b""
            info.size = len(data)
        out.append((info, data))

    for d in ("etc", "etc/ssl", "etc/ssl/certs", "usr", "usr/share", "usr/share/ca-certificates", "opt", "srv",
              "srv/empty", "dev", "bin"):
        add(d, tarfile.DIRTYPE, 0o755)
    add(f"usr/share/ca-certificates/{NON_ASCII}.crt", data=b"certificate\n")
    add(f"etc/ssl/certs/{NON_ASCII}.pem", tarfile.SYMTYPE, 0o777, link=f"/usr/share/ca-certificates/{NON_ASCII}.crt")
    add("etc/ssl/certs/988a38cb.0", tarfile.SYMTYPE, 0o777, link=f"{NON_ASCII}.pem")
    add("etc/fstab", mode=0o600, data=b"# UNCONFIGURED FSTAB\n")          # existing: keeps its mode
    add("etc/hostname", data=b"fixture\n")
    add("etc/hardlink", tarfile.LNKTYPE, 0o644, link="etc/hostname")
    add("opt/noread", mode=0o000, data=b"secret\n")                       # u+r
    add("opt/xonly", mode=0o111, data=b"#!/bin/sh\n")                     # u+r, keeps x
    add("opt/setuid", mode=0o4755, data=b"x")
    add("opt/owned", mode=0o640, data=b"user file\n", uid=1000)
    add("opt/ro", tarfile.DIRTYPE, 0o555)                                 # u+w
    add("opt/ro/file", mode=0o444, data=b"ro\n")
    add("opt/locked", tarfile.DIRTYPE, 0o000)                             # u+rwx
    add("opt/locked/inside", mode=0o600, data=b"in\n")
    path = "opt"
    for d in DEEP:
        path = f"{path}/{d}"
        add(path, tarfile.DIRTYPE, 0o555)
    add(f"{path}/leaf", mode=0o400, data=b"leaf\n")
    add("dev/null-placeholder", data=b"")                                 # dev/* is excluded
    add(".dockerenv", data=b"")                                           # excluded
    add("bin/true", mode=0o755, data=b"#!/bin/sh\nexit 0\n")
    return out


def tar_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in _entries():
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def build(client) -> str:
    """Import the fixture image (idempotent: same tar, same changes) and return its tag."""
    repo, tag = TAG.split(":")
    client.api.import_image_from_data(tar_bytes(), repository=repo, tag=tag, changes=CHANGES)
    return TAG


def superblock(path: str) -> list[str]:
    """The option lines of `unsquashfs -s` (no times, sizes or counts)."""
    out = subprocess.run(["unsquashfs", "-s", path], capture_output=True, text=True, check=True).stdout
    keep = []
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith(("Found a valid", "Creation or last", "Filesystem size", "Number of",
                                         "Inode table", "Directory table", "Fragment table", "Id table",
                                         "Lookup table", "Xattr table", "Block size", "Root inode")):
            continue
        keep.append(line)
    return keep


def listing(path: str) -> dict[str, list[str]]:
    """name -> [mode string, owner uid/gid, symlink target or ''] from `unsquashfs -lln`."""
    out = subprocess.run(["unsquashfs", "-lln", "-d", "", path], capture_output=True, check=True).stdout
    entries = {}
    for raw in out.decode("utf-8", "surrogateescape").splitlines():
        parts = raw.split(None, 5)
        if len(parts) < 5 or parts[0][0] not in "-dlcbps":
            continue
        name, _, target = (parts[5] if len(parts) == 6 else "").partition(" -> ")
        entries[name or "/"] = [parts[0], parts[1], target]
    return entries


def unsquash(sqsh, dest, *flags: str) -> None:
    """unsquashfs SQSH into DEST (which must not exist); a failure carries unsquashfs' own words and
    the free space where it wrote (a 7 GB image tree needs room)."""
    proc = subprocess.run(["unsquashfs", "-q", *flags, "-d", str(dest), str(sqsh)], capture_output=True, text=True)
    if proc.returncode != 0:
        import shutil
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(str(dest)))).free
        raise AssertionError(f"unsquashfs {sqsh} -> {dest} exited with {proc.returncode} "
                             f"({free / 2**30:.1f} GiB free there):\n{(proc.stdout + proc.stderr)[-3000:]}")


def read_member(path: str, member: str) -> str:
    return subprocess.run(["unsquashfs", "-cat", path, member], capture_output=True, text=True, check=True).stdout


def facts(path: str) -> dict:
    files = ("etc/environment", "etc/fstab", "etc/rc", "etc/rc.local")
    return {"superblock": superblock(path), "listing": listing(path),
            "files": {f: read_member(path, f) for f in files}}


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        import docker
        print(build(docker.from_env()))
    elif len(sys.argv) == 3 and sys.argv[1] == "facts":
        print(json.dumps(facts(sys.argv[2]), indent=1, sort_keys=True, ensure_ascii=False))
    else:
        sys.exit(__doc__)

"""The user stage's layer, written directly: what `groupadd --gid GID NAME` and `useradd --create-home
--uid UID --gid GID --shell /bin/bash NAME` write on the base, with no RUN, no builder and no container
started; plus the app directory and the /etc/profile.d script.

It is made from the base's own /etc (`read_etc`: passwd, group, shadow, gshadow, subuid, subgid, skel and
login.defs, taken from a tar of it), as shadow-utils does on Debian:
  - a line appended to passwd, group, shadow and gshadow, the file before kept as `FILE-`, each with the
    base file's mode and owner (shadow and gshadow: root:shadow, 0640);
  - a subordinate uid and gid range where the base has those files: the first SUB_UID_COUNT ids free
    from SUB_UID_MIN (login.defs' values, else 100000 and 65536);
  - the home directory, the user's, mode HOME_MODE (else 0777 without UMASK), with /etc/skel copied
    into it (modes and times kept, the user's).
One decision differs from useradd: the shadow line's last-change day is left empty where useradd
writes the day of the build, so the layer is the same bytes on every day and machine (an empty field
turns password ageing off; the account is locked, `!`, either way). tests/test_user_layer.py compares
the layer with what useradd writes on the same base, file for file.
"""
from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass
from typing import Optional

from toolchain.config import USER_NAME
from toolchain.image import layers

FORMAT = 1  # bump when the layer's bytes change for the same base and settings
ACCOUNT_FILES = ("passwd", "group", "shadow", "gshadow")
SUBID_FILES = ("subuid", "subgid")
_DEFAULTS = {"SUB_UID_MIN": "100000", "SUB_UID_COUNT": "65536", "SUB_GID_MIN": "100000", "SUB_GID_COUNT": "65536",
             "UMASK": "022", "PASS_MIN_DAYS": "0", "PASS_MAX_DAYS": "99999", "PASS_WARN_AGE": "7"}
NAME = re.compile(USER_NAME)
_MAX_ETC = 64 << 20  # a base's /etc is a few MB


class UserLayerError(ValueError):
    """The base cannot take the user as configured (the message says what and what to do)."""


@dataclass(frozen=True)
class _File:
    data: bytes
    mode: int
    uid: int
    gid: int


@dataclass(frozen=True)
class BaseEtc:
    """What the user layer needs of the base's /etc."""
    files: dict[str, _File]                                  # ACCOUNT_FILES and SUBID_FILES the base has
    skel: tuple[tuple[str, Optional[bytes], int, int], ...]  # (path under skel, bytes or None for a directory, mode, mtime)
    login_defs: dict[str, str]


def read_etc(tar_bytes: bytes) -> BaseEtc:
    """The base's /etc from a tar of it (its entries named `etc/...`, as the engine's archive of /etc gives)."""
    files: dict[str, _File] = {}
    skel: list[tuple[str, Optional[bytes], int, int]] = []
    defs = b""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tf:
        for m in tf:
            name = m.name.lstrip("./")
            if not name.startswith("etc/"):
                continue
            rel = name[len("etc/"):]
            if rel in ACCOUNT_FILES + SUBID_FILES and m.isfile():
                files[rel] = _File(tf.extractfile(m).read(), m.mode & 0o7777, m.uid, m.gid)
            elif rel == "login.defs" and m.isfile():
                defs = tf.extractfile(m).read()
            elif rel.startswith("skel/") and (m.isfile() or m.isdir()):
                data = tf.extractfile(m).read() if m.isfile() else None
                skel.append((rel[len("skel/"):], data, m.mode & 0o7777, int(m.mtime)))
    missing = [f for f in ACCOUNT_FILES if f not in files]
    if missing:
        raise UserLayerError(f"the base has no /etc/{missing[0]}: the image's user is added to the base's account "
                             "files; use a base with them (Debian's or Ubuntu's: image.base_image)")
    return BaseEtc(files, tuple(sorted(skel)), _login_defs(defs))


def _login_defs(text: bytes) -> dict[str, str]:
    out = dict(_DEFAULTS)
    for line in text.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and not parts[0].startswith("#"):
            out[parts[0]] = parts[1]
    return out


def _number(defs: dict[str, str], key: str) -> int:
    value = defs.get(key, _DEFAULTS.get(key, ""))
    try:
        return int(value, 8) if value.startswith("0") and len(value) > 1 else int(value)
    except ValueError:
        raise UserLayerError(f"the base's /etc/login.defs sets {key} to {value[:20]!r}, not a number") from None


def _lines(data: bytes) -> list[list[str]]:
    return [l.split(":") for l in data.decode("utf-8", "replace").splitlines() if l.strip()]


def _append(data: bytes, line: str) -> bytes:
    return data + (b"" if not data or data.endswith(b"\n") else b"\n") + line.encode() + b"\n"


def _free_range(ranges: list[tuple[int, int]], low: int, count: int) -> int:
    """The first COUNT ids from LOW that no range of RANGES ((start, count)) holds."""
    start = low
    for s, n in sorted(ranges):
        if start + count <= s:
            break
        start = max(start, s + n)
    return start


def _check_free(etc: BaseEtc, name: str, uid: int, gid: int) -> None:
    users, groups = _lines(etc.files["passwd"].data), _lines(etc.files["group"].data)
    for what, rows, number in (("user", users, uid), ("group", groups, gid)):
        for row in rows:
            if row[0] == name:
                raise UserLayerError(f"image.user.name: the base already has a {what} named {name!r}; choose another "
                                     "name")
            field = "uid" if what == "user" else "gid"
            if len(row) > 2 and row[2] == str(number):
                raise UserLayerError(f"image.user.{field}: the base's {what} {row[0]!r} already has {field} {number}; "
                                     f"choose another {field}")


def user_layer(etc: BaseEtc, name: str, uid: int, gid: int, app_root: str, profile_name: str,
               profile_text: str) -> layers.Layer:
    """The layer that adds user NAME (UID, group NAME of GID, home /home/NAME, /bin/bash) to a base of ETC,
    the directory APP_ROOT/project, and /etc/profile.d/PROFILE_NAME. UserLayerError names what the base
    or the settings do not allow."""
    if not NAME.fullmatch(name):
        raise UserLayerError(f"image.user.name: {name[:40]!r} is not a user name useradd takes (lower-case letters, "
                             "digits, '_' and '-', starting with a letter or '_', at most 32)")
    _check_free(etc, name, uid, gid)
    defs = etc.login_defs
    home = f"home/{name}"
    lines = {"passwd": f"{name}:x:{uid}:{gid}::/{home}:/bin/bash", "group": f"{name}:x:{gid}:",
             "shadow": f"{name}:!::{_number(defs, 'PASS_MIN_DAYS')}:{_number(defs, 'PASS_MAX_DAYS')}:"
                       f"{_number(defs, 'PASS_WARN_AGE')}:::",
             "gshadow": f"{name}:!::"}
    for kind, file in (("UID", "subuid"), ("GID", "subgid")):
        if file in etc.files:
            count = _number(defs, f"SUB_{kind}_COUNT")
            taken = [(int(r[1]), int(r[2])) for r in _lines(etc.files[file].data)
                     if len(r) == 3 and r[1].isdigit() and r[2].isdigit()]
            lines[file] = f"{name}:{_free_range(taken, _number(defs, f'SUB_{kind}_MIN'), count)}:{count}"
    home_mode = (_number(defs, "HOME_MODE") if "HOME_MODE" in defs else 0o777 & ~_number(defs, "UMASK")) & 0o7777

    entries: dict[str, layers.Entry] = {}
    for file, line in lines.items():
        old = etc.files[file]
        entries[f"etc/{file}"] = (_append(old.data, line), old.mode, old.uid, old.gid, layers.MTIME)
        entries[f"etc/{file}-"] = (old.data, old.mode, old.uid, old.gid, layers.MTIME)
    entries[home] = (None, home_mode, uid, gid, layers.MTIME)
    for rel, data, mode, mtime in etc.skel:
        if rel:
            entries[f"{home}/{rel}"] = (data, mode, uid, gid, mtime)
    entries[f"{app_root.strip('/')}/project"] = (None, 0o755, 0, 0, layers.MTIME)
    entries[f"etc/profile.d/{profile_name}"] = (profile_text.encode(), 0o644, 0, 0, layers.MTIME)
    return layers.tar_layer(entries)


def etc_of_image(client, image_ref: str) -> BaseEtc:
    """The /etc of an engine's image, read from a container created from it and never started."""
    container = client.containers.create(image_ref, command=["/bin/true"], network_disabled=True)
    try:
        stream, _ = container.get_archive("/etc")
        buf = bytearray()
        for chunk in stream:
            buf += chunk
            if len(buf) > _MAX_ETC:
                raise UserLayerError(f"{image_ref}'s /etc is over {_MAX_ETC >> 20} MiB; is it a base image?")
        return read_etc(bytes(buf))
    finally:
        container.remove(force=True, v=True)  # with the anonymous volumes a base's VOLUME made

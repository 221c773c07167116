"""The image's user as a layer written from the base's /etc (toolchain/image/user_layer.py): the same
files useradd writes on the same base, the base's rules (login.defs, subordinate ranges, taken names)
followed, and what the base cannot take said with the setting to change."""
from __future__ import annotations

import io
import json
import tarfile

import pytest
from pydantic import ValidationError

from conftest import run_in
from toolchain.config import UserSettings
from toolchain.image import user_layer
from toolchain.image.images import PROFILE_SCRIPT, profile_script

PASSWD = b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = b"root:x:0:\nshadow:x:42:\nnogroup:x:65534:\n"
SHADOW = b"root:*:20000:0:99999:7:::\nnobody:*:20000:0:99999:7:::\n"
GSHADOW = b"root:*::\nshadow:*::\nnogroup:*::\n"


def _etc_tar(files: dict[str, bytes], modes: dict[str, tuple[int, int]] | None = None) -> bytes:
    """A tar of /etc as the engine's archive gives it: FILES by path under etc/ (a name ending in / is a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"etc/{name}".rstrip("/"))
            mode, gid = (modes or {}).get(name, (0o644, 0))
            info.mode, info.gid, info.mtime = mode, gid, 1_700_000_000
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _base(**extra: bytes) -> user_layer.BaseEtc:
    files = {"passwd": PASSWD, "group": GROUP, "shadow": SHADOW, "gshadow": GSHADOW, **extra}
    return user_layer.read_etc(_etc_tar(files, {"shadow": (0o640, 42), "gshadow": (0o640, 42)}))


def _entries(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    tf = tarfile.open(fileobj=io.BytesIO(data))
    return {m.name.rstrip("/"): (m, tf.extractfile(m).read() if m.isfile() else None) for m in tf}


def _layer(etc, name="ray", uid=1000, gid=1000):
    return user_layer.user_layer(etc, name, uid, gid, "/app", PROFILE_SCRIPT, profile_script())


def test_the_accounts_get_one_line_each_and_keep_their_modes_and_a_backup():
    files = _entries(_layer(_base()).data)
    assert files["etc/passwd"][1] == PASSWD + b"ray:x:1000:1000::/home/ray:/bin/bash\n"
    assert files["etc/group"][1] == GROUP + b"ray:x:1000:\n"
    assert files["etc/shadow"][1] == SHADOW + b"ray:!::0:99999:7:::\n"  # the day left empty, locked
    assert files["etc/gshadow"][1] == GSHADOW + b"ray:!::\n"
    assert files["etc/passwd-"][1] == PASSWD and files["etc/shadow-"][1] == SHADOW
    shadow = files["etc/shadow"][0]
    assert (shadow.mode, shadow.uid, shadow.gid) == (0o640, 0, 42)
    home = files["home/ray"][0]
    assert home.isdir() and (home.mode, home.uid, home.gid) == (0o755, 1000, 1000)
    assert files["app/project"][0].isdir() and files[f"etc/profile.d/{PROFILE_SCRIPT}"][1] == profile_script().encode()
    assert "etc/subuid" not in files  # a base without the file gets no range, as useradd gives none
    assert _layer(_base()).data == _layer(_base()).data


def test_subordinate_ranges_skel_and_login_defs_are_the_bases():
    defs = b"# comment\nHOME_MODE 0700\nSUB_UID_COUNT 1000\n"
    etc = user_layer.read_etc(_etc_tar({
        "passwd": PASSWD, "group": GROUP, "shadow": SHADOW, "gshadow": GSHADOW, "login.defs": defs,
        "subuid": b"a:100000:1000\nb:101000:1000\n", "subgid": b"a:100000:65536\nb:300000:65536\n",
        "skel/": b"", "skel/.bashrc": b"# bash\n", "skel/.config/": b"", "skel/.config/x": b"x"}))
    files = _entries(_layer(etc).data)
    assert files["etc/subuid"][1].endswith(b"ray:102000:1000\n")       # the first 1,000 free after a and b
    assert files["etc/subgid"][1].endswith(b"ray:165536:65536\n")      # the gap between a and b is big enough
    assert files["home/ray"][0].mode == 0o700
    bashrc, _ = files["home/ray/.bashrc"]
    assert (bashrc.uid, bashrc.gid, bashrc.mtime) == (1000, 1000, 1_700_000_000)
    assert files["home/ray/.config"][0].isdir() and files["home/ray/.config/x"][1] == b"x"


@pytest.mark.parametrize("name, uid, gid, said", [
    ("root", 1000, 1000, r"image\.user\.name: the base already has a user named 'root'"),
    ("nogroup", 1000, 1000, r"image\.user\.name: the base already has a group named 'nogroup'"),
    ("ray", 65534, 1000, r"image\.user\.uid: the base's user 'nobody' already has uid 65534"),
    ("ray", 1000, 42, r"image\.user\.gid: the base's group 'shadow' already has gid 42"),
    ("Ray:x", 1000, 1000, r"image\.user\.name: 'Ray:x' is not a user name useradd takes"),
])
def test_what_the_base_cannot_take_names_the_setting(name, uid, gid, said):
    with pytest.raises(user_layer.UserLayerError, match=said):
        _layer(_base(), name, uid, gid)


def test_a_base_without_account_files_and_a_bad_name_in_the_settings_are_refused():
    with pytest.raises(user_layer.UserLayerError, match=r"the base has no /etc/shadow"):
        user_layer.read_etc(_etc_tar({"passwd": PASSWD, "group": GROUP}))
    with pytest.raises(ValidationError, match="name"):
        UserSettings(name="ray\nroot")


def _without_day(line: bytes) -> bytes:
    fields = line.split(b":")
    assert fields[2].isdigit(), line  # useradd wrote a day
    return b":".join([*fields[:2], b"", *fields[3:]])


def test_the_layer_is_what_useradd_writes_on_the_same_base(client, built):
    """The session base, with groupadd and useradd run by the engine's builder as the image did before,
    against the layer written from that base's /etc: file for file, modes, owners and contents alike
    (the shadow line's day aside, which useradd takes from the clock)."""
    base = built["cpu"]["base_ref"]
    dockerfile = (f"FROM {base}\nRUN groupadd --gid 1000 ray && useradd --create-home --uid 1000 --gid 1000 "
                  "--shell /bin/bash ray && mkdir -p /app/project\n")
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True, pull=False)
    try:
        saved = io.BytesIO(b"".join(image.save(named=False)))
        with tarfile.open(fileobj=saved) as tf:
            manifest = json.loads(tf.extractfile("manifest.json").read())
            theirs = _entries(tf.extractfile(manifest[0]["Layers"][-1]).read())
    finally:
        client.images.remove(image.id, force=True)
    ours = _entries(_layer(user_layer.etc_of_image(client, base)).data)
    assert set(ours) - set(theirs) == {"etc/profile.d", f"etc/profile.d/{PROFILE_SCRIPT}"}
    assert set(theirs) <= set(ours)
    for name, (m, data) in theirs.items():
        mine, my_data = ours[name]
        if name == "etc/shadow":  # useradd's day of last change, which the layer leaves empty
            data = b"".join(_without_day(l) if l.startswith(b"ray:") else l for l in data.splitlines(keepends=True))
        assert (mine.type, mine.mode & 0o7777, mine.uid, mine.gid, my_data) == \
               (m.type, m.mode & 0o7777, m.uid, m.gid, data), name
        if name.startswith("home/ray/"):
            assert mine.mtime == m.mtime, name  # skel's files keep their times


def test_the_image_runs_as_that_user_with_its_home(client, built):
    out = run_in(client, built["cpu"]["local_ref"], ["sh", "-c", "id; echo $HOME; pwd; ls -ld $HOME | cut -c1-10"])
    assert out.split() == ["uid=1000(ray)", "gid=1000(ray)", "groups=1000(ray)", "/home/ray", "/app/project",
                           "drwxr-xr-x"], out

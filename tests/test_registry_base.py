"""A base image's files as its layers stack, read from gzip layer streams (toolchain/image/registry_base.py):
whiteouts, links, and the interpreter a container would run, told from its files. The session's real
base, read from the real registry, is compared with the engine's probe in tests/test_registry_build.py."""
from __future__ import annotations

import gzip
import importlib.util
import io
import sys
import tarfile

import pytest

from toolchain.image.registry_base import BaseImageError, _read_layer, find_python, resolve

MAGIC = importlib.util.MAGIC_NUMBER


def _layer(*entries) -> io.BytesIO:
    """A gzip layer of ENTRIES: (name, bytes) a file, (name, None) a directory, (name, '->target') a link."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            elif isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what[2:]
                tf.addfile(info)
            else:
                info.size, info.mode = len(what), 0o755
                tf.addfile(info, io.BytesIO(what))
    return io.BytesIO(gzip.compress(raw.getvalue()))


def _stack(*layers_) -> dict:
    """The tree of LAYERS stacked bottom first, as registry_base._read_tree stacks them."""
    tree: dict = {}
    for layer in layers_:
        entries, gone, opaque = _read_layer(layer)
        for path in opaque + gone:
            for p in [p for p in tree if p == path and path in gone or p.startswith(path + "/")]:
                del tree[p]
        tree.update(entries)
    return tree


def _debian_like(minor: int = 11, patch: int = 2) -> io.BytesIO:
    exe = b"\x7fELF..." + f"\x003.{minor}.{patch}\x00".encode() + b"3.2.0\x00"
    return _layer(("usr", None), ("usr/bin", None), ("bin", "->usr/bin"),
                  ("usr/bin/python3", f"->python3.{minor}"), (f"usr/bin/python3.{minor}", exe),
                  (f"usr/lib/python3.{minor}/importlib/_bootstrap_external.py",
                   b"x = 1\nMAGIC_NUMBER = (3495).to_bytes(2, 'little') + b'\\r\\n'\n"),
                  ("etc/passwd", b"root:x:0:0:root:/root:/bin/bash\n"))


def test_the_interpreter_of_a_debian_base_is_told_from_its_files():
    tree = _stack(_debian_like())
    py = find_python(tree, "python3", "/usr/local/bin:/usr/bin:/bin", "base")
    assert (py.version, py.executable, py.cache_tag) == ("3.11.2", "/usr/bin/python3", "cpython-311")
    assert py.magic == ((3495).to_bytes(2, "little") + b"\r\n").hex()
    # the first PATH directory that has it names it, as the interpreter names itself (a link is not followed)
    assert find_python(tree, "python3", "/bin:/usr/bin", "base").executable == "/bin/python3"
    assert resolve(tree, "/bin/python3") == "usr/bin/python3.11"


def test_a_shared_build_s_version_is_in_its_libpython_and_the_compiled_header_wins():
    pyc = MAGIC + b"\0" * 12 + b"code"
    tree = _stack(_layer(("usr/local/bin/python3", "->python3.12"), ("usr/local/bin/python3.12", b"\x7fELF small"),
                         ("usr/local/lib/libpython3.12.so.1.0", b"\x7fELF\x003.12.7\x00more"),
                         ("usr/local/lib/python3.12/importlib/__pycache__/_bootstrap_external.cpython-312.pyc", pyc)))
    py = find_python(tree, "python3", "/usr/local/sbin:/usr/local/bin:/usr/bin", "base")
    assert (py.version, py.executable, py.magic, py.cache_tag) == ("3.12.7", "/usr/local/bin/python3", MAGIC.hex(),
                                                                   "cpython-312")


def test_an_upper_layer_s_whiteout_removes_the_interpreter_and_an_opaque_directory_hides_what_was_below():
    lower = _debian_like()
    upper = _layer(("usr/bin/.wh.python3.11", b""), ("etc/skel", None), ("etc/skel/.wh..wh..opq", b""),
                   ("etc/skel/.profile", b"new\n"))
    below_skel = _layer(("etc/skel", None), ("etc/skel/.bashrc", b"old\n"))
    tree = _stack(lower, below_skel, upper)
    assert "usr/bin/python3.11" not in tree and "usr/bin/python3" in tree  # the link stays, dangling
    assert sorted(p for p in tree if p.startswith("etc/skel/")) == ["etc/skel/.profile"]
    with pytest.raises(BaseImageError, match=r"base: it has no python3 on its PATH \(/usr/bin:/bin\)"):
        find_python(tree, "python3", "/usr/bin:/bin", "base")


@pytest.mark.parametrize("layer, match", [
    (_layer(("usr/bin/python3", b"#!/bin/sh\n")), "cannot tell which Python 3"),
    (_layer(("usr/bin/python3.11", b"\x7fELF no version"),
            ("usr/lib/python3.11/importlib/_bootstrap_external.py", b"")), "holds no Python 3.11 version string"),
    (_layer(("usr/bin/python3.11", b"\x003.11.4\x00")), "no importlib/_bootstrap_external"),
    (_layer(("usr/bin/python3", "->/usr/bin/python3")), "no python3 on its PATH"),  # a link to itself
])
def test_what_cannot_be_told_is_one_line_naming_the_base(layer, match):
    with pytest.raises(BaseImageError, match=match) as e:
        find_python(_stack(layer), "python3.11" if "version" in match or "importlib" in match else "python3",
                    "/usr/bin", "image.base_image reg/base@sha256:ab")
    assert str(e.value).startswith("image.base_image reg/base@sha256:ab: ") and "\n" not in str(e.value)


def test_this_interpreter_read_from_its_own_files_is_what_it_says_of_itself():
    """The host's own Python, its files laid out as a layer: the reading gives what the probe prints."""
    import os
    import sysconfig
    exe = os.path.realpath(sys.executable)
    prefix = sys.base_prefix.lstrip("/")
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    entries = [(exe.lstrip("/"), open(exe, "rb").read())]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    for name in (sysconfig.get_config_var("INSTSONAME") or "",):
        if name and os.path.exists(os.path.join(libdir, name)):
            entries.append((os.path.join(libdir, name).lstrip("/"), open(os.path.join(libdir, name), "rb").read()))
    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "importlib", "_bootstrap_external.py")
    entries.append((stdlib.lstrip("/"), open(stdlib, "rb").read()))
    py = find_python(_stack(_layer(*entries)), exe, "/usr/bin", "host")
    assert (py.version, py.magic, py.cache_tag) == (sys.version.split()[0], MAGIC.hex(), sys.implementation.cache_tag)
    assert prefix and minor in py.cache_tag.replace("cpython-3", "3.")

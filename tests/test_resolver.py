"""The requirement set's resolution for the image (toolchain/wheels/resolver.py): uv, against the real index, keeps
the newest release of a package whose dependency is published only as an sdist, where pip's wheels-only
resolution steps back to an old one; the pool's wheel for each pin is the one the image takes."""
import pytest
from packaging.version import Version

from toolchain.wheels import resolver
from toolchain.wheels.wheelhouse import _pip_download

PY = "3.11"


def test_uv_keeps_the_newest_release_whose_dependency_is_only_an_sdist(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_CACHE", str(tmp_path / "cache"))
    resolved = {p.name: p for p in resolver.resolve(["hydra-core"], PY, tmp_path / "pool")}
    pins = {n: p.version for n, p in resolved.items()}
    assert pins["hydra-core"] >= Version("1.3"), pins
    assert pins["antlr4-python3-runtime"] == Version("4.9.3"), pins  # hydra-core 1.3 needs 4.9.*: an sdist only
    # the lock names hydra-core's wheel on the index, and none of antlr4's (its wheel is built here)
    assert resolved["hydra-core"].wheels[0].url.startswith("https://") and resolved["antlr4-python3-runtime"].wheels == ()
    # what pip chooses from wheels alone, for the same platform: a hydra-core of before 1.0
    pool = tmp_path / "pip"
    res = _pip_download(pool, ["hydra-core"], PY, ["--quiet"])
    assert res.returncode == 0, res.stderr[-2000:]
    (chosen,) = [w.name for w in pool.glob("hydra_core-*.whl")]
    assert Version(chosen.split("-")[1]) < Version("1.0"), chosen


def test_a_set_that_cannot_be_resolved_is_one_line_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(resolver.ResolveError, match="no-such-package-raytrain") as e:
        resolver.resolve(["no-such-package-raytrain-test==1.0"], PY, tmp_path / "pool")
    assert "\n" not in str(e.value)


def test_the_pool_s_wheel_for_a_pin_is_the_most_specific_the_image_takes(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    for name in ("foo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                 "foo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "foo-1.0-cp311-cp311-manylinux_2_39_x86_64.whl",   # a newer glibc than the base's
                 "foo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",   # another Python
                 "foo-1.1-cp311-cp311-manylinux_2_28_x86_64.whl",   # another release
                 "Bar_Baz-2.0-py3-none-any.whl", "qux-1.0-cp311-cp311-macosx_11_0_arm64.whl", "not a wheel.whl"):
        (pool / name).write_bytes(b"")
    (pool / "link-1.0-py3-none-any.whl").symlink_to(pool / "Bar_Baz-2.0-py3-none-any.whl")
    pins = [resolver.Pin(n, Version(v)) for n, v in (("foo", "1.0"), ("bar-baz", "2.0"), ("qux", "1.0"), ("link", "1.0"),
                                                     ("absent", "3"))]
    have = {p.text: w for p, w in resolver.in_pool(pins, pool, PY).items()}
    assert have == {"foo==1.0": "foo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                    "bar-baz==2.0": "Bar_Baz-2.0-py3-none-any.whl"}


def _probe_wheel(pool, body: bytes = b"") -> "Path":
    """A wheel of a package no index has, as a build from an sdist leaves it in the pool."""
    import zipfile
    pool.mkdir(exist_ok=True)
    path = pool / "raytrain_pool_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("raytrain_pool_probe/__init__.py", body)
        z.writestr("raytrain_pool_probe-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: raytrain-pool-probe\nVersion: 1.0\n")
        z.writestr("raytrain_pool_probe-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("raytrain_pool_probe-1.0.dist-info/RECORD", "")
    return path


def test_uv_finds_the_pool_s_wheels_by_its_page_of_recorded_sha256s(tmp_path, monkeypatch):
    import hashlib
    import json
    import os
    from toolchain.wheels import pool_page
    monkeypatch.setenv("RAYTRAIN_CACHE", str(tmp_path / "cache"))
    pool = tmp_path / "pool"
    wheel = _probe_wheel(pool)
    real = hashlib.sha256(wheel.read_bytes()).hexdigest()
    # a package no index has, found in the pool through its page
    (pin,) = resolver.resolve(["raytrain-pool-probe"], PY, pool)
    assert (pin.name, str(pin.version), pin.wheels) == ("raytrain-pool-probe", "1.0", ())  # a file:// wheel: not fetched
    st = os.stat(wheel)  # hashed once for the page, and recorded with its stat
    assert json.loads((pool / pool_page.HASHES).read_text())[wheel.name] == [
        real, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]

    def listed() -> str:
        text = pool_page.page(pool, tmp_path / "page.html").read_text()
        (link,) = [l for l in text.splitlines() if wheel.name in l]
        assert link.startswith(f'<a href="{wheel.as_uri()}#sha256=')
        return link.split("#sha256=")[1][:64]
    # the record of the file as it is now is taken, the wheel not read (a download checked it: `record`)
    pool_page.record(pool, {wheel.name: "ab" * 32})
    assert listed() == "ab" * 32
    # a wheel written again (its stat another) is hashed again
    wheel.unlink()
    _probe_wheel(pool, b"# another build\n")
    assert listed() == hashlib.sha256(wheel.read_bytes()).hexdigest() != real

"""ImageRef: the registry grammar, parsed once; renderings for docker, Pyxis and .sqsh names."""
import pytest

from runtime.imageref import ImageRef, ImageRefError

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text,registry,repo,tag,digest", [
    ("raytrain-cpu", None, "raytrain-cpu", None, None),
    ("raytrain-cpu:cpu-latest", None, "raytrain-cpu", "cpu-latest", None),
    (f"127.0.0.1:5000/raytrain-cpu@{D}", "127.0.0.1:5000", "raytrain-cpu", None, D),
    (f"registry.example.com:5000/team/ml/raytrain-gpu:v1@{D}", "registry.example.com:5000", "team/ml/raytrain-gpu", "v1", D),
    ("localhost/a__b/c-d.e", "localhost", "a__b/c-d.e", None, None),
    (f"[::1]:5000/x@{D}", "[::1]:5000", "x", None, D),
    ("[2001:db8::1]/team/x:tag", "[2001:db8::1]", "team/x", "tag", None),
    ("team/x", None, "team/x", None, None),
])
def test_parse_and_render_round_trip(text, registry, repo, tag, digest):
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repo, tag, digest)
    assert ref.docker() == text and ImageRef.parse(ref.docker()) == ref


def test_pyxis_and_sqsh_forms():
    ref = ImageRef.parse(f"registry.example.com:5000/team/raytrain-gpu@{D}")
    assert ref.pyxis() == f"registry.example.com:5000#team/raytrain-gpu@{D}"
    assert ref.sqsh_name() == f"raytrain-gpu+sha256-{'ab' * 32}.sqsh"
    assert ImageRef.parse(f"x@{D}").pyxis() == f"x@{D}"
    with pytest.raises(ImageRefError, match="not pinned by digest"):
        ImageRef.parse("registry.example.com/x:latest").pyxis()


@pytest.mark.parametrize("text,loopback", [
    ("127.0.0.1:5000/x", True), ("localhost:5000/x", True), ("[::1]:5000/x", True), ("127.8.9.1/x", True),
    ("registry.example.com:5000/x", False), ("10.0.0.1:5000/x", False), ("x", False)])
def test_loopback(text, loopback):
    assert ImageRef.parse(text).loopback is loopback


@pytest.mark.parametrize("text,part", [
    ("", "empty"), ("Raytrain", "repository"), ("ray train", "spaces"), ("http://host:5000/x", "registry"),
    ("x@sha256:abc", "digest"), (f"x@{D}\nrm -rf /", "control"), ("host:99999/x", "registry"),
    ("x:-bad", "tag"), ("x//y", "repository"), ("[zz::1]:5000/x", "registry"), ("a" * 5000, "too long"),
    ("x/", "repository"), ("-x", "repository")])
def test_bad_references_say_which_part(text, part):
    with pytest.raises(ImageRefError, match=part):
        ImageRef.parse(text)

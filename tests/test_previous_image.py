"""toolchain/image/previous_image.py and toolchain/image/provenance.py against Debian's docker-registry (no engine):
images put there with the registry client, as a push leaves them, then read back as a fresh runner's push
and build read them; the previous images they cannot use, each said; the provenance label, untrusted."""
from __future__ import annotations

import gzip
import re
import json

import pytest

from deploy.registry.client import RegistryClient, manifest
from runtime.digest import Digest
from toolchain.image.previous_image import GZIP_LAYERS, HeldBlob, PreviousImageError, held_layers, pair_layers
from toolchain.progress import Reporter


class Told(Reporter):
    def __init__(self):
        super().__init__(quiet=True)
        self.warnings: list[str] = []

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


def _layer(text: str) -> tuple[Digest, bytes]:
    tar = text.encode() * 100
    return Digest.of(tar), gzip.compress(tar, mtime=0)


def _config(diff_ids: list) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()


@pytest.fixture
def reg(tmp_path):
    from helpers.small_image import PlainRegistry
    server = PlainRegistry(tmp_path / "reg")
    client = RegistryClient(server.address, "team/app", 30)
    yield client
    client.close()
    server.stop()


def _put(reg: RegistryClient, tag: str, layers: list[tuple[Digest, bytes]], config: bytes) -> bytes:
    for _, blob in layers:
        reg.upload(Digest.of(blob), lambda b=blob: b, len(blob), "a layer")
    reg.upload(Digest.of(config), lambda: config, len(config), "the config")
    body = manifest(config, [(Digest.of(b), len(b)) for _, b in layers])
    reg.put_manifest(tag, body)
    return body


def test_a_previous_push_pairs_each_layer_with_its_blob(reg):
    layers = [_layer("base"), _layer("wheel")]
    _put(reg, "cpu-latest", layers, _config([d for d, _ in layers]))
    told = Told()
    held = held_layers(reg, ["cpu-latest", "cpu-0123456789abcdef"], told)  # the second tag is not there yet
    assert held == {d: HeldBlob(Digest.of(b), len(b)) for d, b in layers} and not told.warnings
    assert all(isinstance(k, Digest) for k in held)


def test_a_previous_image_that_cannot_be_paired_is_said_and_skipped(reg):
    layers = [_layer("base"), _layer("wheel")]
    _put(reg, "short", layers, _config([layers[0][0]]))  # a config that lists one diff ID for two layers
    told = Told()
    assert held_layers(reg, ["short"], told) == {}
    assert len(told.warnings) == 1 and f"{reg.host}/team/app:short" in told.warnings[0]
    assert "1 diff IDs for the manifest's 2 layers" in told.warnings[0]


def test_pair_layers_refuses_what_is_not_one_image_and_skips_layers_it_cannot_name():
    d, blob = _layer("x")
    good = json.loads(manifest(_config([d]), [(Digest.of(blob), len(blob))]))
    mt = good["mediaType"]
    cases = {
        b"{": "not JSON",
        json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}).encode():
            "a list of platforms",
        json.dumps({**good, "schemaVersion": 1}).encode(): "not a schema 2",
        json.dumps({**good, "layers": {"a": 1}}).encode(): "not a list of descriptors",
        json.dumps({**good, "layers": [{**good["layers"][0], "digest": "sha256:xyz"}]}).encode(): "layer 0's digest",
        json.dumps({**good, "layers": [{**good["layers"][0], "size": True}]}).encode(): "not a blob's size",
    }
    for body, words in cases.items():
        with pytest.raises(PreviousImageError, match=words):
            pair_layers(body, mt, _config([d]))
    with pytest.raises(PreviousImageError, match="no rootfs.diff_ids"):
        pair_layers(json.dumps(good).encode(), mt, b"[]")
    zstd = {**good, "layers": [{**good["layers"][0], "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd"}]}
    assert pair_layers(json.dumps(zstd).encode(), mt, _config([d])) == {}  # the push's manifests say gzip
    assert good["layers"][0]["mediaType"] in GZIP_LAYERS


def _provenance(diff_ids: list):
    from toolchain.image import provenance
    return provenance.Provenance(
        format=1, user_key="a" * 64, lower_layers=1, python=("3.11.2", "/usr/bin/python3", "a70d0d0a", "cpython-311"),
        compiler=None, venv="/opt/venv", wheels=[provenance.WheelFact(file="six-1.17.0-py2.py3-none-any.whl",
                                                                    sha256="b" * 64, size=10, modules=False)],
        layers=[provenance.LayerFact(key="c" * 64, diff_id=d, wheels=["six-1.17.0-py2.py3-none-any.whl"],
                                     scripts=[("six-tool", "#!/opt/venv/bin/python\n")]) for d in diff_ids])


def test_the_provenance_label_reads_back_what_was_written_and_refuses_what_was_not():
    from toolchain.image import provenance
    d = _layer("wheel")[0]
    label = _provenance([d]).text()
    assert provenance.parse(label) == _provenance([d])
    doc = json.loads(label)
    bad = {
        "not JSON": "{",
        "format": json.dumps({**doc, "format": 2}),
        "layers.0.diff_id": json.dumps({**doc, "layers": [{**doc["layers"][0], "diff_id": "sha256:zz"}]}),
        "layers.0.scripts": json.dumps({**doc, "layers": [{**doc["layers"][0], "scripts": [["../../etc/x", "a"]]}]}),
        "extra": json.dumps({**doc, "more": 1}),
        "wheels.0.file": json.dumps({**doc, "wheels": [{**doc["wheels"][0], "file": "../x.whl"}]}),
    }
    for words, text in bad.items():
        with pytest.raises(provenance.ProvenanceError, match=re.escape(words) if words != "extra" else "more"):
            provenance.parse(text)


def test_a_previous_image_whose_label_does_not_match_its_layers_is_refused(reg):
    from toolchain.image import provenance
    from toolchain.image.registry_build import NoEngineBuildError, read_previous
    from runtime.imageref import ImageRef
    layers = [_layer("base"), _layer("wheel")]
    config = json.loads(_config([d for d, _ in layers]))
    config[provenance.FIELD] = _provenance([_layer("other")[0]]).text()
    _put(reg, "cpu-latest", layers, json.dumps(config).encode())
    with pytest.raises(NoEngineBuildError, match="field does not list the dependency layers its config has"):
        read_previous(reg, ImageRef.parse(f"{reg.host}/team/app:cpu-latest"), "no engine here")
    config[provenance.FIELD] = _provenance([layers[1][0]]).text()
    _put(reg, "cpu-latest", layers, json.dumps(config).encode())
    previous = read_previous(reg, ImageRef.parse(f"{reg.host}/team/app:cpu-latest"), "no engine here")
    assert previous.made_from.layers[0].diff_id == layers[1][0] and set(previous.held) == {d for d, _ in layers}

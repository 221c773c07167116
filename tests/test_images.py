"""Built images: imports work, spec baked at CLUSTER_SPEC_PATH, non-root, labelled, layers shared."""
import io
import json
import marshal
import os
import re
import subprocess
import sys
import tarfile
import uuid

from conftest import SPEC, run_in
from test_venv_layer import make_wheel
from runtime.spec import spec_hash
from toolchain.image import bytecode, layers
from toolchain.image.images import SPEC_PATH_IN_IMAGE, git_revision
from toolchain.image.venv_layer import LayerWriter, Python, planned_modules, top_layer, wheels_of


def test_cpu_image_selfcheck(client, built):
    img = built["cpu"]
    out = json.loads(run_in(client, img["local_ref"], ["python", "-m", "runtime", "selfcheck"]).strip().splitlines()[-1])
    assert out["cluster_spec_path"] == SPEC_PATH_IN_IMAGE
    assert out["user"] != "root" and out["uid"] != 0
    assert out["ray"] and out["torch"]
    assert out["cluster_name"] == "local-docker"


def test_user_is_numeric_and_login_shells_keep_the_venv(client, built):
    """A kubelet can only verify runAsNonRoot for a numeric USER; enroot runs /etc/rc through a login
    shell, whose /etc/profile resets PATH: `python` and `ray` must still be the venv's, for any uid."""
    img = built["cpu"]["local_ref"]
    assert client.images.get(img).attrs["Config"]["User"] == "1000:1000"
    for user in ("1000:1000", "0:0", "4242:4242"):
        for shell in ("/bin/sh", "/bin/bash"):
            out = client.containers.run(img, [shell, "-lc", "command -v python; command -v ray"], entrypoint=[],
                                        user=user, remove=True).decode()
            assert out.split() == ["/opt/venv/bin/python", "/opt/venv/bin/ray"], (user, shell, out)


def test_spec_file_in_image_equals_input(client, built):
    got = run_in(client, built["cpu"]["local_ref"], ["sh", "-c", 'cat "$CLUSTER_SPEC_PATH"'])
    assert got.encode() == SPEC.read_bytes()


def test_labels(client, built):
    for variant, img in built.items():
        labels = client.images.get(img["local_ref"]).labels
        assert labels["io.raytrain.variant"] == variant
        assert labels["io.raytrain.spec-sha256"] == spec_hash(SPEC)
        assert labels["org.opencontainers.image.revision"]
        assert labels["io.raytrain.toolchain-version"]


def test_the_revision_label_is_the_commit_in_a_checkout_another_user_owns(tmp_path):
    """A CI job's user is often not the checkout's owner (git: "dubious ownership"): the label is still
    the commit, so the image does not depend on who built it."""
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root, to give the checkout to another user (CI runs as root)")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for path in [tmp_path, *tmp_path.rglob("*")]:
        os.lchown(path, 4242, 4242)
    assert git_revision(tmp_path / ".") == head
    assert git_revision(tmp_path / "nothing-here") == "unknown"


def test_gpu_torch_is_cuda_build_and_base_shared(client, built):
    out = run_in(client, built["gpu"]["local_ref"], ["python", "-m", "runtime", "selfcheck", "--require-cuda"])
    assert json.loads(out.strip().splitlines()[-1])["torch_cuda"]
    base = client.images.get(built["cpu"]["base_ref"]).attrs["RootFS"]["Layers"]
    for variant in ("cpu", "gpu"):
        layers = client.images.get(built[variant]["local_ref"]).attrs["RootFS"]["Layers"]
        # [base..., user (RUN and COPY), one per wheel or group..., venv top, app, spec]: the same base at the bottom
        assert layers[:len(base)] == base
        deps = client.images.get(built[variant]["deps_ref"]).attrs["RootFS"]["Layers"]
        assert layers[:len(deps)] == deps and len(layers) == len(deps) + 2 and len(set(layers)) == len(layers)
        assert len(deps) - len(base) - 2 - 1 >= 20  # the example's 48 wheels: at least 20 layers of their own


def test_no_credentials_in_image_or_history(client, built):
    img = client.images.get(built["cpu"]["local_ref"])
    history = json.dumps(img.history()) + json.dumps(img.attrs["Config"])
    for word in ("RAY_AUTH_TOKEN=", "PASSWORD", "SECRET", "AWS_"):
        assert word not in history
    found = run_in(client, built["cpu"]["local_ref"],
                   ["sh", "-c", "ls -a /root /home/*/ 2>/dev/null; ls /root/.docker /home/*/.docker 2>/dev/null || true"])
    assert ".netrc" not in found and "config.json" not in found


def test_equal_inputs_give_equal_tags(settings, built):
    from toolchain import pipeline
    from toolchain.progress import Reporter
    again = pipeline.build(settings, str(SPEC), "cpu", Reporter(quiet=True))["images"]["cpu"]
    assert again["local_ref"] == built["cpu"]["local_ref"]
    assert again["rebuilt"] == []


def test_hostile_label_values_round_trip(client, built):
    """Labels go into the assembled image's JSON config: quotes, $, backslashes, newlines come back verbatim."""
    from toolchain.image import layers
    hostile = {"io.raytrain.test-a": 'x"; $(touch /tmp/pwned) `id` \\ ${HOME}', "io.raytrain.test-b": "a b=c '*' & {\n}"}
    lower = client.images.get(built["cpu"]["base_ref"]).attrs
    layer = layers.make_layer([("etc/raytrain-test", b"x", False)])
    config = layers.image_config(lower, [*lower["RootFS"]["Layers"], layer.diff_id], labels=hostile)
    image_id = layers.load(client, [layer], config, "raytrain-test-labels:1")
    try:
        assert {k: client.images.get(image_id).labels[k] for k in hostile} == hostile
    finally:
        client.images.remove(image_id, force=True)



def test_the_venv_is_byte_compiled_for_the_image_interpreter(client, built):
    """The bytecode layer (toolchain/image/bytecode.py): ray's and torch's modules load from their .pyc, which
    the image's own Python accepts (a stale or foreign .pyc would be compiled again: 'code object from'
    the source instead)."""
    out = run_in(client, built["cpu"]["local_ref"], ["sh", "-c", "python -v -c 'import ray, torch' 2>&1"])
    for module in ("ray/__init__.py", "torch/__init__.py", "torch/nn/modules/module.py"):
        assert re.search(rf"/__pycache__/{re.escape(module.rsplit('/', 1)[1][:-3])}\.cpython-3\d+\.pyc matches "
                         rf"\S*site-packages/{re.escape(module)}", out), module
    assert not re.search(r"code object from '/opt/venv/\S+\.py'", out)  # nothing compiled from source


def test_the_container_compile_agrees_with_the_host_compile(client, built, tmp_path):
    """The two ways to the bytecode layer (toolchain/image/bytecode.py) give the same files: the host's workers
    while the venv is written, and `compileall` in a container of the image (the way for a base whose
    Python is not the host's). Same names, same headers (magic, unchecked-hash flag, source hash), and the
    same code once loaded; the image's interpreter accepts the host's files (the test above)."""
    wh = tmp_path / "wh"
    wh.mkdir()
    make_wheel(wh, "alpha", "1.0", {"alpha/__init__.py": b'"""doc"""\nfrom .b import f\n',
                                    "alpha/b.py": b"def f(x, *, y=2):\n    return f'{x!r:>{y}}'\n",
                                    "alpha/old.py": b"print 'python 2'\n", "alpha/data.txt": b"x\n"})
    user = client.images.get(built["cpu"]["user_ref"]).attrs
    tag = sys.implementation.cache_tag
    py = Python("3.11.2", "/usr/bin/python3")
    wheels = wheels_of(wh, "3.11")
    compiler = bytecode.HostCompiler(workers=1, planned=planned_modules(wheels, py, "/opt/venv"))
    try:
        compiled = compiler.of(wheels)
    finally:
        compiler.close()
    host_failed = sum(pyc is None for pyc in compiled.values())
    host = layers.make_layer([(bytecode.pyc_name(n, tag), pyc, False) for n, pyc in compiled.items() if pyc is not None])
    writer = LayerWriter(wheels, py, "/opt/venv", tmp_path / "store").files()
    venv = writer.finish(None)  # the sources alone
    top = top_layer(py, "/opt/venv", writer.out.scripts)
    ref = f"raytrain-pyctest:{uuid.uuid4().hex[:8]}"
    layers.load(client, [venv, top], layers.image_config(user, [*user["RootFS"]["Layers"], venv.diff_id, top.diff_id]), ref)
    try:
        container, container_failed = bytecode.compiled_layer(client, ref, "/opt/venv", tmp_path / "pyc")
    finally:
        client.images.remove(ref, force=True)
    assert host_failed == 1 and container_failed >= 1  # alpha/old.py (compileall's count is of its *** lines)

    def pycs(layer):
        with tarfile.open(fileobj=io.BytesIO(layer.data)) as tf:
            return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    a, b = pycs(host), pycs(container)
    assert sorted(a) == sorted(b) and len(a) == 2, (sorted(a), sorted(b))
    for name in a:
        assert a[name][:16] == b[name][:16], name
        assert marshal.loads(a[name][16:]).co_code == marshal.loads(b[name][16:]).co_code, name


def test_the_image_imports_every_top_level_module_of_every_wheel(client, built, settings):
    """One layer per wheel (toolchain/image/venv_plan.py) still makes one venv: every distribution of the
    wheelhouse is installed, and each of its top-level modules imports."""
    from pathlib import Path
    script = (Path(__file__).parent / "helpers" / "import_every_top_level.py").read_text()
    out = run_in(client, built["cpu"]["local_ref"], ["python", "-c", script]).strip().splitlines()
    modules, dists = map(int, out[0].split())
    from toolchain.progress import Reporter
    from toolchain.wheels.wheelhouse import ensure_wheelhouse
    wh = ensure_wheelhouse(settings, "cpu", "3.11", Reporter(quiet=True))  # the set the build used
    assert dists == len(wh.wheels) and modules >= dists and out[1:] == []


def test_the_code_s_directory_is_the_image_user_s_and_the_runtime_root_s(client, built):
    """A script that writes beside itself (generated data, a plot, a checkpoint) can, as in a checkout."""
    out = run_in(client, built["cpu"]["local_ref"], ["sh", "-c", "touch /app/project/made && stat -c '%u %g' "
                 "/app/project /app/project/train.py; touch /app/runtime/x 2>/dev/null && echo writable || echo ro"])
    assert out.split("\n")[:3] == ["1000 1000", "1000 1000", "ro"], out

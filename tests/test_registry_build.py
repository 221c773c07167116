"""`build` and `push` with no Docker engine (toolchain/image/registry_build.py): a runner of uid 1000 whose
DOCKER_HOST points at nothing, with an empty HOME and user cache, adds one small wheel to the image the
session pushed to the real docker-registry. Only the wheels of the changed layer are downloaded, only the changed layers are
uploaded, the image is the one the engine's build makes from the same inputs, and it runs on the engine.
A first build, with no image in the registry, builds on the base pinned there (`base.publish`): the base's
layers are mounted, its /etc and Python read from them, and the image is the engine's again.
What the previous image or the base does not allow is one line, with nothing written."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from conftest import ROOT, SESSION, SPEC, make_settings, run_in
from deploy import engine_pull
from deploy.registry.client import RegistryClient, manifest
from runtime.imageref import ImageRef
from toolchain import cache, pipeline
from toolchain.progress import Reporter
from toolchain.publish.blobs import BlobCache
from toolchain.publish.engine_load import FromBuild
from toolchain.publish.push import BLOB_CACHE
from toolchain.records import build_file
from toolchain.image import provenance, registry_build
from toolchain.image.registry_base import BaseImageError
from toolchain.image.registry_build import NoEngineBuildError

ADDED = "six==1.17.0"  # 11 KiB: a small wheel, which goes to a group layer with a few others


@pytest.fixture
def no_engine(tmp_path, monkeypatch):
    """A fresh runner: no engine reachable, an empty HOME and user cache; (that cache, the session's)."""
    session = os.environ[cache.ENV]
    home, fresh = tmp_path / "home", tmp_path / "fresh-cache"
    home.mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(cache.ENV, str(fresh))
    return fresh, session


def _session_image_as_previous(pushed_cpu: dict) -> None:
    """Tag the session's pushed cpu image `cpu-latest` again: the image a build with no engine starts from.
    Other tests push their own projects to the session's repository under that tag."""
    ref = ImageRef.parse(pushed_cpu["repo_digest"], "the session's pushed image").require_pinned()
    reg = RegistryClient(ref.registry, ref.repository, stall_s=30)
    try:
        body, _ = reg.get_manifest(ref.digest)
        reg.put_manifest("cpu-latest", body)
    finally:
        reg.close()


def _pushed_config(repo_digest: str) -> dict:
    """The config of the image REPO_DIGEST names, from the registry."""
    ref = ImageRef.parse(repo_digest, "a pushed image").require_pinned()
    reg = RegistryClient(ref.registry, ref.repository, stall_s=30)
    try:
        manifest = json.loads(reg.get_manifest(ref.digest)[0])
        return json.loads(reg.get_small_blob(manifest["config"]["digest"], "the config"))
    finally:
        reg.close()


def _session_versions(pushed_cpu: dict, dest: Path) -> Path:
    """A constraints file (uv's UV_CONSTRAINT) of every version the session's image recorded. Both builds
    below resolve to the session's versions plus six, whatever the index serves by the time they run:
    in CI a runner once resolved another grpcio than the session's image held, and wrote its layer too."""
    made = provenance.parse(_pushed_config(pushed_cpu["repo_digest"])[provenance.FIELD])
    pins = sorted({"{}=={}".format(*parse_wheel_filename(w.file)[:2]) for w in made.wheels})
    dest.write_text("\n".join(pins) + "\n")
    return dest


def _project(tmp_path, app_dir, settings, name: str, added: str = ADDED, runtime_dir: Path | None = None):
    app = tmp_path / f"app-{name}"
    shutil.copytree(app_dir, app)
    if added:
        with open(app / "requirements.txt", "a") as f:
            f.write(f"{added}\n")
    s = make_settings(tmp_path / f"work-{name}", app, registry_address=settings.registry.address,
                      runtime_dir=runtime_dir or app_dir.parent / "runtime")
    s.registry.data_dir = settings.registry.data_dir
    return s


RUNNER_UID = 1000
# what a CI runner's job is given besides its own HOME: the index, its certificates and proxies
_PASSED = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
           "http_proxy", "https_proxy", "no_proxy")
_BUILD_AND_PUSH = """
import json, sys
from toolchain import pipeline
from toolchain.config import Settings
from toolchain.progress import Reporter
s = Settings.model_validate_json(open(sys.argv[1]).read())
built = pipeline.build(s, sys.argv[2], "cpu", Reporter())["images"]["cpu"]
pushed = pipeline.push(s, sys.argv[2], "cpu", Reporter())["images"]["cpu"]["push"]
print(json.dumps({"uid": __import__("os").getuid(), "built": built, "push": pushed}, default=str))
"""


@pytest.fixture
def runner_dir():
    """A directory the runner's user owns, outside pytest's (root's, mode 700)."""
    d = Path(tempfile.mkdtemp(prefix="raytrain-runner-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _setpriv(*cmd: str) -> list[str]:
    return ["setpriv", f"--reuid={RUNNER_UID}", f"--regid={RUNNER_UID}", "--clear-groups", *cmd]


def _runner_python(work: Path) -> tuple[str, dict]:
    """The runner's Python: the one the session's image was compiled with (a build records its bytecode
    compiler and refuses another), as the runner's own copy where uid 1000 cannot read this one (pyenv's
    under /root). (Its path, the environment it needs.)"""
    base = Path(sys.base_prefix)
    exe = Path(sys._base_executable)
    if subprocess.run(_setpriv("test", "-x", str(exe))).returncode == 0:
        return str(exe), {}
    mine = work / "python"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if (mine / "bin" / version).exists():
        return str(mine / "bin" / version), {"LD_LIBRARY_PATH": str(mine / "lib")}
    (mine / "bin").mkdir(parents=True)
    shutil.copy2(exe, mine / "bin" / version)
    shutil.copytree(base / "lib" / version, mine / "lib" / version,
                    ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__"))
    for lib in (base / "lib").glob("libpython*.so*"):
        shutil.copy2(lib, mine / "lib" / lib.name, follow_symlinks=False)
    return str(mine / "bin" / version), {"LD_LIBRARY_PATH": str(mine / "lib")}


def _as_runner(work: Path, settings, spec: Path) -> dict:
    """build then push, in a process of uid 1000 with no engine (DOCKER_HOST at nothing), an empty HOME
    and cache, this checkout's code and its venv's packages on the path of the runner's Python."""
    site = sysconfig.get_paths()["purelib"]
    readable = subprocess.run(_setpriv("test", "-r", f"{ROOT}/toolchain/pipeline.py", "-a", "-r",
                                       f"{site}/pydantic/__init__.py"))
    assert readable.returncode == 0, f"uid {RUNNER_UID} cannot read {ROOT} or {site}: the runner test needs both"
    python, python_env = _runner_python(work)
    home, fresh = work / "home", work / "cache"
    home.mkdir(exist_ok=True)
    (work / "settings.json").write_text(settings.model_dump_json())
    shutil.chown(work, RUNNER_UID, RUNNER_UID)
    for path in work.rglob("*"):
        os.lchown(path, RUNNER_UID, RUNNER_UID)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{site}", "LANG": "C.UTF-8",
           cache.ENV: str(fresh), "DOCKER_HOST": f"unix://{work}/no-engine.sock", **python_env,
           **{k: v for k, v in os.environ.items() if k in _PASSED or k.startswith(("PIP_", "UV_"))}}
    res = subprocess.run(_setpriv(python, "-c", _BUILD_AND_PUSH, str(work / "settings.json"), str(spec)),
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    print(res.stderr)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_dependency_change_builds_and_pushes_with_no_engine_and_no_cache(client, pushed, settings, app_dir,
                                                                          tmp_path, runner_dir, monkeypatch):
    _session_image_as_previous(pushed["cpu"])
    monkeypatch.setenv("UV_CONSTRAINT", str(_session_versions(pushed["cpu"], runner_dir / "session-versions.txt")))
    # the runner's copy of the project: its code, the runtime and the spec where uid 1000 can read them
    shutil.copytree(app_dir.parent / "runtime", runner_dir / "runtime")
    spec = runner_dir / "cluster-spec.json"
    shutil.copy2(SPEC, spec)
    s = _project(runner_dir, app_dir, settings, "ci", runtime_dir=runner_dir / "runtime")
    s.registry.data_dir = str(runner_dir / "registry-data")  # the runner does not own the registry's files
    ran = _as_runner(runner_dir, s, spec)
    built, res = ran["built"], ran["push"]
    assert ran["uid"] == RUNNER_UID
    assert built["engine"] is False and built["rebuilt"] == ["deps", "app", "spec"]
    assert built["base_ref"] == pushed["cpu"]["repo_digest"]  # the image cpu-latest named, pinned
    pool = runner_dir / "cache" / cache.WHEELS
    downloaded = {f.name: f.stat().st_size for f in pool.glob("*.whl")}
    assert any(n.startswith("six-1.17.0-") for n in downloaded), downloaded
    # the wheels of the one group layer six joins, and no other (the set is 3.9 GiB: torch alone 0.9)
    assert sum(downloaded.values()) < 8 << 20 and not any(n.startswith(("torch-", "ray-")) for n in downloaded)

    # the group layer six joins and the app layer (its requirements.txt); the base, user, other wheel,
    # venv and spec layers were there
    assert res["layers_pushed"] == 2 and res["bytes_uploaded"] < 8 << 20, res
    assert res["layers_compressed"] == 2 and res["layers_known_from_registry"] >= 30, res

    # the engine's build of the same inputs (in the session's cache) makes the same image
    same = _project(tmp_path, app_dir, settings, "engine")
    with_engine = pipeline.build(same, str(SPEC), "cpu", Reporter())["images"]["cpu"]
    assert with_engine["engine"] is True
    ref = json.loads((s.build_dir / "images.json").read_text())["cpu"]["repo_digest"]
    assert _pushed_config(ref)["rootfs"]["diff_ids"] == client.images.get(with_engine["local_ref"]).attrs["RootFS"]["Layers"]
    assert (with_engine["image_id"], with_engine["local_ref"]) == (built["image_id"], built["local_ref"])

    # and the pushed image runs: six imports beside torch, and the runtime's self-check passes
    client.images.remove(with_engine["local_ref"], force=True)
    out = run_in(client, ref, ["python", "-c", "import six, torch; print('six', six.__version__)"])
    assert "six 1.17.0" in out
    check = json.loads(run_in(client, ref, ["python", "-m", "runtime", "selfcheck"]).strip().splitlines()[-1])
    assert check["user"] == "ray" and check["cluster_spec_path"] == "/etc/raytrain/cluster-spec.json"

    # the same runner, warm, takes six out again: the changed group's other wheels are in its pool, none is
    # downloaded, and the image is the session's again, digest for digest, with nothing to upload
    requirements = runner_dir / "app-ci" / "requirements.txt"
    requirements.write_text(requirements.read_text().replace(f"{ADDED}\n", ""))
    before = sorted(f.name for f in pool.iterdir())
    again = _as_runner(runner_dir, s, spec)
    assert sorted(f.name for f in pool.iterdir()) == before
    assert again["built"]["engine"] is False and again["push"]["digest"] == pushed["cpu"]["digest"], again["push"]
    assert again["push"]["bytes_uploaded"] == 0, again["push"]


def _no_base(s):
    """S under a repository name whose base no test puts in the registry (`pushed_base` puts the session's
    there, where a first build finds it)."""
    return s.model_copy(update={"image": s.image.model_copy(update={"repository": f"{SESSION}-no-base"})})


def test_what_the_registry_cannot_give_is_one_line_and_nothing_is_written(client, pushed, settings, app_dir,
                                                                          tmp_path, no_engine):
    # no previous image: a variant whose repository the registry has never seen
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(SPEC.read_text()), "cpu_image": f"{SESSION}-never-pushed-cpu"}))
    s = _no_base(_project(tmp_path, app_dir, settings, "none"))
    with pytest.raises(NoEngineBuildError, match=rf"cannot reach the Docker engine .* the registry has no .*"
                                                 rf"{SESSION}-never-pushed-cpu:cpu-latest to build on") as e:
        pipeline.build(s, str(other), "cpu", Reporter())
    assert "\n" not in str(e.value) and not build_file(s.build_dir).exists()

    # another image user: the user stage the registry's image has is not this project's
    _session_image_as_previous(pushed["cpu"])
    s = _no_base(_project(tmp_path, app_dir, settings, "user"))
    s = s.model_copy(update={"image": s.image.model_copy(update={"user": s.image.user.model_copy(update={"uid": 4242})})})
    with pytest.raises(NoEngineBuildError, match="the base or the image's user changed since"):
        pipeline.build(s, str(SPEC), "cpu", Reporter())
    assert not build_file(s.build_dir).exists()


def _with_base(s, base: str):
    return s.model_copy(update={"image": s.image.model_copy(update={"base_image": base})})


def _spec_for(dest: Path, repository: str) -> Path:
    """The session's spec, naming another cpu image repository (one the registry has never held)."""
    dest.write_text(json.dumps({**json.loads(SPEC.read_text()), "cpu_image": repository}))
    return dest


@pytest.fixture(scope="module")
def pushed_base(client, settings, registry, built):
    """The session's base (debootstrap) pushed by `base.publish`: its pinned reference."""
    out = pipeline.push_base(settings, f"{settings.registry.address}/{SESSION}-base", Reporter())
    assert out["base"] == built["cpu"]["base_ref"]
    return out["base_image"]


def test_a_first_build_with_no_engine_builds_on_the_base_the_registry_holds(client, pushed, pushed_base, settings,
                                                                             app_dir, tmp_path, runner_dir, monkeypatch):
    monkeypatch.setenv("UV_CONSTRAINT", str(_session_versions(pushed["cpu"], runner_dir / "session-versions.txt")))
    shutil.copytree(app_dir.parent / "runtime", runner_dir / "runtime")
    spec = _spec_for(runner_dir / "cluster-spec.json", f"{SESSION}-first-cpu")
    s = _with_base(_project(runner_dir, app_dir, settings, "first", added="", runtime_dir=runner_dir / "runtime"),
                   pushed_base)
    s.registry.data_dir = str(runner_dir / "registry-data")
    # a runner that keeps its wheel pool between jobs (docs/ci.md), and nothing else: no engine, no image of
    # the project in the registry, no layer or blob cache
    pool = runner_dir / "cache" / cache.WHEELS
    pool.mkdir(parents=True)
    for whl in (Path(os.environ[cache.ENV]) / cache.WHEELS).glob("*.whl"):
        os.link(whl, pool / whl.name)
    before = sorted(f.name for f in pool.glob("*.whl"))
    ran = _as_runner(runner_dir, s, spec)
    built, res = ran["built"], ran["push"]
    assert ran["uid"] == RUNNER_UID and built["engine"] is False
    assert built["rebuilt"] == ["user", "deps", "app", "spec"] and built["base_ref"] == pushed_base
    assert sorted(f.name for f in pool.glob("*.whl")) == before  # nothing downloaded
    # the base's one layer mounted from its repository, every other layer uploaded
    assert res["layers_mounted"] == 1 and res["layers_existing"] == 0, res
    ref = json.loads((s.build_dir / "images.json").read_text())["cpu"]["repo_digest"]
    first = _pushed_config(ref)

    # the layers are the session's engine-built image's, bottom to top, but the spec's (another cpu_image)
    session = _pushed_config(pushed["cpu"]["repo_digest"])
    assert first["rootfs"]["diff_ids"][:-1] == session["rootfs"]["diff_ids"][:-1]
    assert provenance.parse(first[provenance.FIELD]).python == provenance.parse(session[provenance.FIELD]).python

    # the engine's build of the same inputs (the base by the same reference) makes the same image
    same = _with_base(_project(tmp_path, app_dir, settings, "first-engine", added=""), pushed_base)
    with_engine = pipeline.build(same, str(spec), "cpu", Reporter())["images"]["cpu"]
    assert with_engine["engine"] is True
    assert (with_engine["image_id"], with_engine["local_ref"]) == (built["image_id"], built["local_ref"])

    # and it runs as the image's user
    check = json.loads(run_in(client, ref, ["python", "-m", "runtime", "selfcheck"]).strip().splitlines()[-1])
    assert check["user"] == "ray" and check["uid"] == 1000
    client.images.remove(ref, force=True)


def _push_tiny_base(registry: str, repository: str, files: dict) -> str:
    """An image of one layer of FILES (path: bytes) pushed as it is; its pinned reference."""
    import gzip
    import io
    import tarfile
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    blob = gzip.compress(raw.getvalue(), mtime=0)
    from runtime.digest import Digest
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [Digest.of(raw.getvalue())]}}).encode()
    reg = RegistryClient(registry, repository, stall_s=30)
    try:
        for data in (blob, config):
            reg.upload(Digest.of(data), lambda data=data: data, len(data), "a blob")
        return f"{registry}/{repository}@{reg.put_manifest('v1', manifest(config, [(Digest.of(blob), len(blob))]))}"
    finally:
        reg.close()


def test_a_base_the_registry_cannot_give_is_one_line_and_nothing_is_written(client, registry, settings, app_dir,
                                                                           tmp_path, no_engine):
    spec = _spec_for(tmp_path / "spec.json", f"{SESSION}-never-pushed-cpu")
    address = settings.registry.address
    account = {"etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n", "etc/group": b"root:x:0:\n",
               "etc/shadow": b"root:*::0:99999:7:::\n", "etc/gshadow": b"root:*::\n"}
    no_python = _push_tiny_base(address, f"{SESSION}-tiny-base", account)
    no_etc = _push_tiny_base(address, f"{SESSION}-tiny-base", {"usr/bin/python3": b"#!"})
    missing = no_python.rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    cases = [
        (f"{address}/{SESSION}-tiny-base:v1", NoEngineBuildError, "must be pinned in a registry"),
        (missing, NoEngineBuildError, "the registry does not have it"),
        (no_python, BaseImageError, r"it has no python3 on its PATH \(/usr/bin:/bin\); use a base with Python 3"),
        (no_etc, BaseImageError, "the base has no /etc/passwd"),
        # the same registry by another name is another registry to a mount
        (no_python.replace("127.0.0.1:", "localhost:"), NoEngineBuildError,
         r"is in localhost:\d+, and the image is pushed to 127.0.0.1:\d+: .* copy the base there"),
    ]
    for i, (base, error, match) in enumerate(cases):
        s = _with_base(_project(tmp_path, app_dir, settings, f"base-{i}", added=""), base)
        with pytest.raises(error, match=match) as e:
            pipeline.build(s, str(spec), "cpu", Reporter())
        assert "\n" not in str(e.value), str(e.value)
        assert not build_file(s.build_dir).exists() and not (s.build_dir / "layers").exists(), base


def test_an_engine_without_the_projects_stages_builds_from_the_registry_and_loads_nothing(
        client, pushed, settings, app_dir, tmp_path, monkeypatch):
    """A CI runner's fresh engine (it holds no stage of the project) is not used: `build` takes the registry's
    way, as a runner with no engine does; `--load`, or an engine that holds the project's stages, builds in it."""
    import io
    from toolchain.image import way
    _session_image_as_previous(pushed["cpu"])
    monkeypatch.setenv("UV_CONSTRAINT", str(_session_versions(pushed["cpu"], tmp_path / "session-versions.txt")))
    s = _project(tmp_path, app_dir, settings, "fresh-engine")
    s = s.model_copy(update={"image": s.image.model_copy(update={"repository": f"{SESSION}-fresh"})})
    assert not client.images.list(name=f"{SESSION}-fresh-stages")

    def session_images() -> set:  # (ID, tags) of the engine's images of this session (their tags name it)
        return {(i.id, tuple(sorted(i.tags))) for i in client.images.list(all=True) if any(SESSION in t for t in i.tags)}
    before, said = session_images(), io.StringIO()
    try:
        built = pipeline.build(s, str(SPEC), "cpu", Reporter(stream=said))["images"]["cpu"]
        assert built["engine"] is False and built["rebuilt"] == ["deps", "app", "spec"], said.getvalue()
        assert f"build[cpu]: without the engine, on {settings.registry.address}/" in said.getvalue()
        # nothing went into the engine: no stage, no image, no tag
        assert session_images() == before and not client.images.list(name=f"{SESSION}-fresh-stages")
        res = pipeline.push(s, str(SPEC), "cpu", Reporter(stream=said))["images"]["cpu"]
        # at most six's group layer and the app layer go up (an earlier test may have pushed them), and the
        # registry's manifest names the image built
        assert res["push"]["layers_pushed"] <= 2 and res["push"]["bytes_uploaded"] < 8 << 20, res["push"]
        ref = ImageRef.parse(res["repo_digest"], "the pushed image").require_pinned()
        reg = RegistryClient(ref.registry, ref.repository, stall_s=30)
        try:
            assert json.loads(reg.get_manifest(ref.digest)[0])["config"]["digest"] == built["image_id"]
        finally:
            reg.close()
    finally:
        _session_image_as_previous(pushed["cpu"])  # other tests start from the session's image
    # where the image is wanted in the engine, or the engine holds the project's stages, the engine builds
    assert way.choose(s, load=True, variants=["cpu"])["cpu"].registry_first is False
    assert way.choose(settings, load=False, variants=["cpu"])["cpu"].registry_first is False
    # the gpu image, which the engine here does not run, is made for the registry whatever the engine holds
    gpu = way.choose(settings, load=False, variants=["cpu", "gpu"])["gpu"]
    assert gpu.registry_first and gpu.base_to_local and "does not run the gpu image" in gpu.why
    assert way.choose(settings, load=True, variants=["gpu"])["gpu"].registry_first is False


def test_load_where_no_engine_answers_is_one_line_and_nothing_is_written(settings, app_dir, tmp_path, no_engine):
    from toolchain.errors import ConfigError
    s = _project(tmp_path, app_dir, settings, "load", added="")
    with pytest.raises(ConfigError, match=r"^--load: the image goes into the Docker engine, and cannot reach the "
                                          r"Docker engine \(.*no-engine.sock does not exist\)") as e:
        pipeline.build(s, str(SPEC), "cpu", Reporter(), load=True)
    assert "\n" not in str(e.value) and not build_file(s.build_dir).exists()


def test_a_registry_that_is_not_running_is_a_short_cause_for_the_engine_s_build(tmp_path):
    """What an engine's build says when it goes to the engine because nothing answers at the registry (the
    README's first run: the local registry starts at the push)."""
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = RegistryClient(f"127.0.0.1:{port}", "proj-cpu", stall_s=5)
    try:
        with pytest.raises(NoEngineBuildError) as e:
            registry_build.read_previous(reg, ImageRef.parse(f"127.0.0.1:{port}/proj-cpu:cpu-latest"), "no engine")
    finally:
        reg.close()
    assert e.value.cause == f"no image to build on: the registry 127.0.0.1:{port} is not running"
    assert str(e.value).startswith("no engine, and the registry of 127.0.0.1:") and "\n" not in str(e.value)


def test_where_the_registry_cannot_give_the_build_an_engine_that_holds_nothing_of_the_project_builds_it(
        client, built, pushed, settings, app_dir, tmp_path):
    """The engine holds no stage of the project, and the registry cannot give the build (here: its base is an
    engine image, not pinned in a registry): the engine builds it, and one line says why."""
    import io
    s = _project(tmp_path, app_dir, settings, "fallback", added="")
    s = _with_base(s.model_copy(update={"image": s.image.model_copy(update={"repository": f"{SESSION}-fallback"})}),
                   built["cpu"]["base_ref"])
    assert not client.images.list(name=f"{SESSION}-fallback-stages")
    said = io.StringIO()
    again = pipeline.build(s, str(SPEC), "cpu", Reporter(stream=said))["images"]["cpu"]
    line = next(l for l in said.getvalue().splitlines() if "build[cpu]:" in l)
    assert line.endswith(f"build[cpu]: in the engine (the engine holds no stage of this project ({SESSION}-fallback-"
                         f"stages); image.base_image '{built['cpu']['base_ref']}' must be pinned in a registry "
                         "(registry/repository@sha256:...) to be used without one)"), line
    assert again["engine"] is True and client.images.list(name=f"{SESSION}-fallback-stages")
    assert client.images.get(again["local_ref"]).id == again["image_id"]


def test_the_gpu_image_is_made_for_the_registry_on_the_projects_base_and_never_loaded(
        client, built, pushed, settings, app_dir, tmp_path, monkeypatch):
    """The engine here never runs the gpu image (the local target runs the cpu one): without --load, `build`
    makes it from the registry, on this project's own base, which it puts in the local registry first where
    that lacks it. Nothing of the project goes into the engine, and the layers are the engine's build's."""
    import io
    from toolchain.image.images import layer_store
    monkeypatch.setenv("UV_CONSTRAINT", str(_session_versions(pushed["cpu"], tmp_path / "session-versions.txt")))
    repo = f"{SESSION}-gpureg"
    s = _project(tmp_path, app_dir, settings, "gpu-registry", added="")
    # the gpu variant with the cpu one's torch: the session's cpu wheels, so no layer is written anew
    s = s.model_copy(update={"image": s.image.model_copy(update={
        "repository": repo, "torch": {**s.image.torch, "gpu": s.image.torch["cpu"]}})})
    spec = tmp_path / "gpu-spec.json"
    spec.write_text(json.dumps({**json.loads(SPEC.read_text()), "gpu_image": f"{repo}-gpu"}))
    key = built["cpu"]["base_ref"].rsplit(":", 1)[1]
    client.images.get(built["cpu"]["base_ref"]).tag(f"{repo}-base", key)  # the project's base, bootstrapped here

    def project_images() -> set:  # every tag of the project in the engine, but its base's
        return {t for i in client.images.list(all=True) for t in i.tags
                if t.startswith(repo) and not t.startswith(f"{repo}-base:")}
    try:
        said = io.StringIO()
        made = pipeline.build(s, str(spec), "gpu", Reporter(stream=said))["images"]["gpu"]
        text = said.getvalue()
        assert made["engine"] is False, text
        assert f"pushed the base: {settings.registry.address}/{repo}-base@sha256:" in text, text
        assert (f"build[gpu]: without the engine, on this project's base {settings.registry.address}/{repo}-base"
                f"@sha256:") in text, text
        assert made["base_ref"].startswith(f"{settings.registry.address}/{repo}-base@sha256:")
        assert not project_images()

        # the layers are the session's engine-built cpu image's (the same base, user, wheels and code), but
        # the spec's (another gpu_image)
        config = json.loads(layer_store(s.build_dir).read_config(made["image_id"]))
        session = client.images.get(built["cpu"]["local_ref"]).attrs["RootFS"]["Layers"]
        assert config["rootfs"]["diff_ids"][:-1] == session[:-1]

        # again: the base is in the registry, so `build` writes nothing there, and the image is the same
        said = io.StringIO()
        again = pipeline.build(s, str(spec), "gpu", Reporter(stream=said))["images"]["gpu"]
        assert "pushed the base" not in said.getvalue() and again["image_id"] == made["image_id"], said.getvalue()
        assert not project_images()

        # deployed here (the local target, --sqsh), it is loaded from this build, not pulled: the engine holds
        # the session's cpu image, so only the spec's layer travels, and the pushed reference resolves
        ref = pipeline.push(s, str(spec), "gpu", Reporter(stream=io.StringIO()))["images"]["gpu"]["repo_digest"]
        lines: list[str] = []
        image = engine_pull.image(client, ref, lines.append, FromBuild.of(s.build_dir))
        assert image.id == made["image_id"] and ref in image.attrs["RepoDigests"], lines
        assert re.fullmatch(re.escape(f"loading {ref} into the engine from this machine's build: 1 layer(s), ") +
                            r"[0-9.]+ [KM]iB" + re.escape(f" (the engine holds the {len(session) - 1} below)"),
                            lines[0]), lines
        assert lines[1].startswith(f"loaded {ref} in ") and len(lines) == 2, lines  # no pull

        # a build that left too little of it (the spec's layer neither as a tar nor as a blob) loads nothing
        client.images.remove(image.id, force=True)
        top = config["rootfs"]["diff_ids"][-1]
        layer_store(s.build_dir).drop_tar(top)
        BlobCache(s.build_dir / BLOB_CACHE).drop(top)
        lines.clear()
        assert FromBuild.of(s.build_dir)(client, ref, lines.append) is False
        assert lines == [f"this machine's build lacks 1 of the 1 layer(s) the engine needs for {ref} (taken from the "
                         "registry, never written here): it is pulled"], lines
        assert not project_images()
    finally:
        for tag in project_images() | {f"{repo}-base:{key}"}:
            client.images.remove(tag, force=True)

"""Fixtures against the real Docker engine and a real docker-registry. Nothing here is mocked.

Hermetic: the session has its own user cache (RAYTRAIN_CACHE, for every subprocess too) and its own
image names (SESSION-cpu, SESSION-stages, SESSION-base, ...), so neither ~/.cache/raytrain nor the
images a build of the user's left in the engine can change an outcome. What the session adds to the
engine and the cache is removed when it ends (and a dead session's images when the next one starts).
The run is two workers, each a session of its own; the tests that must not run beside each other are
grouped (`_group`, below).

Markers, given here so that no test module has to remember them:
  docker   the test uses the engine (a fixture that needs it: client, built, pushed, registry, ...);
           without a reachable engine these tests are skipped with the reason, not errored, except
           under CI (CI set), where a missing engine fails them
  cluster  the module starts real Ray nodes or a real Slurm (its `pytestmark` says so)
The fast tier, engine-free and cluster-free (spec, image refs, identity, renderers, goldens, fuzzing,
injection): `pytest -m "not docker and not cluster"`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from toolchain import pipeline
from toolchain.config import Settings, scratch_settings
from toolchain.progress import Reporter
from toolchain.publish.local_registry import start_local, stop_local

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
ROOT = Path(__file__).resolve().parent.parent
REGISTRY_PORT = int(os.environ.get("TEST_REGISTRY_PORT", "5055"))

SESSION = f"rtt{os.getpid()}"  # the prefix of every image name this session builds
_SESSION_RE = re.compile(r"rtt(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


for _stale in Path(tempfile.gettempdir()).glob("raytrain-rtt*-*"):  # a killed session's cache (gigabytes)
    _m = re.fullmatch(r"raytrain-rtt(\d+)-.*", _stale.name)
    if _m and not _alive(int(_m.group(1))):
        shutil.rmtree(_stale, ignore_errors=True)
SESSION_DIR = Path(tempfile.mkdtemp(prefix=f"raytrain-{SESSION}-"))
if "PYTEST_XDIST_WORKER" not in os.environ:  # the process that starts the workers: they inherit it
    os.environ["RAYTRAIN_TEST_RUN_DIR"] = str(SESSION_DIR)
# the run's, whichever process (a node's process that imports a test module has no run: its own): removed at its end
RUN_DIR = Path(os.environ.get("RAYTRAIN_TEST_RUN_DIR", SESSION_DIR))
os.environ["RAYTRAIN_CACHE"] = str(SESSION_DIR / "cache")  # toolchain/cache.py; inherited by subprocesses
# Every resolution of the run (uv's, in builds and in subprocesses) sees PyPI as it was when the run began:
# a release published during the run would make a later build of the same requirements another image than
# the session's, and a test that counts what a one-wheel change rebuilds would count that release's layer.
os.environ.setdefault("UV_EXCLUDE_NEWER", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


# What the run's nodes leave in the temp dir: the Ray temp dir of a node that shares its host (runtime/
# cluster/launch.py `temp_dir_args`: raytrain-<port>; Ray keeps its sessions' logs there), and where a test
# kills a launcher (SIGKILL: it can remove nothing) its zygote's directory (runtime/cluster/zygote.py
# `start`; the zygote ends and takes only its socket) and the output of its `ray start` (ray_node.py).
_LEFT_BY_NODES = ("raytrain-zygote-*", "raytrain-[0-9]*", "ray-start-*.log")
_BEFORE_RUN: set = set()


def _in_worker() -> bool:
    """Whether this process is one of pytest-xdist's workers (not the process that started them)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def _left_by_nodes() -> set:
    tmp = Path(tempfile.gettempdir())
    return {p for pattern in _LEFT_BY_NODES for p in tmp.glob(pattern)}


def pytest_sessionstart(session):
    if not _in_worker():
        _BEFORE_RUN.update(_left_by_nodes())


def _remove_what_nodes_left() -> None:
    """What the run's nodes left on this host goes at its end, by the process that started the workers,
    once every worker is done (a worker's end is not the run's: the other one may be starting a node).
    A zygote's directory with a socket is a zygote still serving, another run's: it stays."""
    for path in _left_by_nodes() - _BEFORE_RUN:
        if path.is_dir() and not path.is_symlink():
            if not (path / "zygote.sock").exists():
                shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _session_spec() -> Path:
    """cluster_specs/local.json with the session's image names."""
    data = json.loads((ROOT / "cluster_specs" / "local.json").read_text())
    data.update(cpu_image=f"{SESSION}-cpu", gpu_image=f"{SESSION}-gpu")
    path = SESSION_DIR / "local.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


SPEC = _session_spec()


def make_settings(workdir: Path, app_dir: Path, registry_address: str | None = None, runtime_dir: Path | None = None,
                  **registry_kw) -> Settings:
    """Project settings for a test: its own build dir and app copy, the session's image names and cache."""
    reg = {"address": registry_address or f"127.0.0.1:{REGISTRY_PORT}", "data_dir": str(workdir.parent / "registry-data"),
           "retry_backoff_s": 0.2, **registry_kw}
    return scratch_settings(ROOT, workdir, app_dir, SPEC, reg, runtime_dir, repository=SESSION)


def _session_images(client, alive_only: bool) -> list[str]:
    """Tags of this session's images (ALIVE_ONLY False: also those of sessions whose process is gone)."""
    found = []
    for image in client.images.list(all=True):
        for tag in image.tags:
            m = _SESSION_RE.match(tag)
            if not m:
                continue
            pid = int(m.group(1))
            if pid == os.getpid() or (not alive_only and not _alive(pid)):
                found.append(tag)
    return found


def _remove_images(client, tags: list[str]) -> None:
    import docker
    for tag in tags:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.APIError:
            pass  # gone already, or still used by a container a test left: the next session sweeps it
    try:
        client.images.prune(filters={"dangling": True})
    except docker.errors.APIError:
        pass


def pytest_sessionfinish(session, exitstatus):
    """The session's images and its cache go (gigabytes: the wheel pool, the layer stores)."""
    if not _in_worker():
        _remove_what_nodes_left()
    if _ENGINE.get("client") is not None:
        _remove_images(_ENGINE["client"], _session_images(_ENGINE["client"], alive_only=True))
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


_ENGINE: dict = {}


ENGINE_FIXTURES = {"client"}  # every fixture that reaches the engine depends on this one


# The run is two processes (pytest-xdist's `-n 2`, pyproject.toml): tests that cannot share this host
# with each other are one group, which one worker runs in order (`pytest_xdist_make_scheduler`).
# "engine": the session's images, built once per worker that asks for them (7 GiB), its wheel pool (3.9
# GiB, downloaded once per worker), and the local registry on its fixed port. "hosts": real Ray nodes and
# Slurm daemons on the host itself, on fixed ports (test_launch's 22000, the Slurm helper's 16917). A
# local-target job's nodes are containers on a network of their own, so an "engine" test may run beside a
# "hosts" one; the rest (no engine, no daemons) go to whichever worker is free.
ENGINE_GROUP = ENGINE_FIXTURES | {"registry", "example_wheels"}
HOSTS_GROUP = {"slurm", "two_nodes"}
_GROUPS = "groups.json"  # in RUN_DIR: each test's group, as the workers collected them


def _group(item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & ENGINE_GROUP:
        return "engine"
    if fixtures & HOSTS_GROUP or item.get_closest_marker("cluster"):
        return "hosts"
    return None


def pytest_collection_modifyitems(config, items):
    groups = {}
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
        groups[item.nodeid] = _group(item)
    if _in_worker():  # every worker collects the same tests: the last one's file is the same as the first's
        tmp = RUN_DIR / f"{_GROUPS}.{os.environ['PYTEST_XDIST_WORKER']}"
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, RUN_DIR / _GROUPS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, where a test's scope is its group, or the test itself. (Not xdist's
    own `--dist loadgroup`: under pytest 9.2 its group marks change no test's ID, and are ignored.) The
    scheduler asks for scopes once every worker has collected, so the groups' file is there."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        _groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = json.loads((RUN_DIR / _GROUPS).read_text())
            return self._groups.get(nodeid) or nodeid
    return ByGroup(config, log)


# what the Docker tier writes at its peak, in GiB (20.6 measured: docs/tests.md): in the temp dir, the
# session's wheels (4), blobs stored once with the local registry's files (4), and a second project's layer
# tars (7, test_packaging); in the engine, the session's images (7, their layers once)
DISK_NEEDED_GB = {"temp": 14, "engine": 8}


def _short_of_disk(c) -> str:
    """Why the disks the Docker tier writes to have too little room for it, or ''."""
    need: dict = {}
    places = {"temp": Path(tempfile.gettempdir()), "engine": Path((c.info() or {}).get("DockerRootDir") or "/")}
    for what, path in places.items():
        if not path.is_dir():
            continue
        dev = os.stat(path).st_dev
        gb, where = need.get(dev, (0, path))
        need[dev] = (gb + DISK_NEEDED_GB[what], where)
    short = [f"{where} has {shutil.disk_usage(where).free / 2**30:.1f} GiB free, the Docker tier needs about {gb} there"
             for gb, where in need.values() if shutil.disk_usage(where).free / 2**30 < gb]
    if not short:
        return ""
    return "; ".join(short) + " (free some: docker system prune, ~/.cache/raytrain, old /tmp/pytest-of-*)"


@pytest.fixture(scope="session")
def client():
    import docker  # here: the engine-free tests do not need the SDK's import or an engine
    try:
        c = docker.from_env(timeout=900)
        c.ping()
    except docker.errors.DockerException as e:
        why = f"no Docker engine reachable here ({e}); start dockerd or set DOCKER_HOST"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI requires the Docker tier", pytrace=False)
        pytest.skip(why)
    _remove_images(c, _session_images(c, alive_only=False))  # what a killed session left
    short = _short_of_disk(c)
    if short:
        if os.environ.get("CI"):
            pytest.fail(f"{short}: CI requires the Docker tier", pytrace=False)
        pytest.skip(short)
    _ENGINE["client"] = c
    return c


@pytest.fixture
def private_registry(tmp_path):
    """Debian's docker-registry with its own CA and an htpasswd login (tests/helpers/tls_registry.py)."""
    from helpers.tls_registry import TlsRegistry
    reg = TlsRegistry(tmp_path / "registry").start()
    yield reg
    reg.stop()


@pytest.fixture
def trusted_ca(private_registry):
    """The registry's CA where the engine and the registry client look for it: /etc/docker/certs.d/<host:port>/ca.crt."""
    from deploy.registry.client import CERTS_D
    d = CERTS_D / private_registry.address
    d.mkdir(parents=True, exist_ok=False)
    shutil.copy(private_registry.ca, d / "ca.crt")
    yield d / "ca.crt"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("project")


@pytest.fixture(scope="session")
def app_dir(session_dir):
    """Snapshots of the example project and the runtime: edits to the repo mid-run change nothing."""
    dst = session_dir / "app"
    shutil.copytree(ROOT / "examples" / "train", dst, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "runtime", session_dir / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="session")
def settings(session_dir, app_dir):
    return make_settings(session_dir / "main", app_dir)


@pytest.fixture(scope="session")
def example_wheels(settings) -> list:
    """The example's cpu wheel set for the image's Python (3.11, bookworm), downloaded into the session's
    cache once (the cpu build takes the same set)."""
    from toolchain.wheels.wheelhouse import ensure_wheelhouse
    return ensure_wheelhouse(settings, "cpu", "3.11", Reporter(quiet=True)).files


@pytest.fixture(scope="session")
def built(client, settings):
    """cpu and gpu images built once per session in the engine (`--load`: tests run both there), under the
    session's names: from nothing but the engine's own layers (a build of the user's leaves no stage the
    session can reuse). Once per run: a second worker that asks for them fails, naming the test (its group
    is not "engine")."""
    try:
        (RUN_DIR / "session-images-built").touch(exist_ok=False)
    except FileExistsError:
        pytest.fail("another worker built the session's images: this test must be in the \"engine\" group "
                    "(tests/conftest.py _group), or the run builds 7 GiB twice", pytrace=False)
    return pipeline.build(settings, str(SPEC), "cpu,gpu", Reporter(), load=True)["images"]


@pytest.fixture(scope="session")
def registry(settings):
    st = start_local(settings, Reporter())
    yield st
    if st.started_here:
        stop_local(settings)
        shutil.rmtree(settings.registry.data_dir, ignore_errors=True)  # gigabytes of blobs


def run_in(client, image: str, cmd: list[str], **kw) -> str:
    return client.containers.run(image, cmd, remove=True, **kw).decode()


@pytest.fixture(scope="session")
def pushed(built, registry, settings):
    """The cpu and gpu images pushed to the test registry, digests in the session's build/images.json."""
    return pipeline.push(settings, str(SPEC), "cpu,gpu", Reporter())["images"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real Slurm on this host (tests/helpers/slurm.py: munged, slurmctld, three slurmd), per module."""
    from helpers.slurm import SlurmCluster
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def two_nodes():
    import ray  # here, not at the top: the engine-free tests run without ray (and torch) importable
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"}})
    yield cluster
    ray.shutdown()
    cluster.shutdown()

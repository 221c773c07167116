"""Layered image builds: base -> user -> deps -> app -> spec, each stage tagged by a content key.

A stage is built only when its tag is missing, so a one-line code change rebuilds the app and
spec stages, a spec change rebuilds the spec stage only, and a requirements change writes the
layers of the wheels that changed (toolchain/image/deps_stage.py) and the thin ones above. Equal inputs
give equal tags. The image's layers, bottom first: [base, user (2), one per wheel or group of
small wheels (toolchain/image/venv_plan.py), the venv's top layer, app, spec] (docs/image-layers.md).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import docker

from deploy.layer_store import LayerStore
from runtime.digest import Digest
from runtime.imageref import ImageRef
from runtime.spec import ClusterSpec, LoadedSpec
from runtime.contract import APP_ROOT, IMAGE_PYTHONPATH, PROJECT_DIR, SKYPILOT_PROFILE, SPEC_PATH as SPEC_ENV, VENV
from toolchain import __version__, skypilot_profile
from toolchain.image import bytecode, layers, provenance, user_layer, venv_layer, venv_plan
from toolchain.image.bootstrap import BaseImage, ensure_base
from toolchain.image.deps_stage import DepsAssembly
from toolchain.config import Settings
from toolchain.docker_client import image_exists
from toolchain.errors import BuildError, ConfigError
from toolchain.hashing import key_of, tree_hash
from toolchain.records import BuildRecord, write_builds
from toolchain.progress import Reporter, human_bytes
from toolchain.image.venv_layer import Python
from toolchain.image.venv_plan import LayerIndex, default_index, scripts_of
from toolchain.wheels.wheelhouse import Wheelhouse, ensure_wheelhouse, image_set, requirements_key

SPEC_PATH_IN_IMAGE = "/etc/raytrain/cluster-spec.json"
IMAGE_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROFILE_SCRIPT = "00-raytrain-venv.sh"
LAYER_STORE = "layers"  # <build_dir>/layers: the assembled layers (deploy/layer_store.py)


def layer_store(build_dir: Path) -> LayerStore:
    """The build directory's layer store."""
    return LayerStore(build_dir / LAYER_STORE)
APP_FORMAT = 2  # the app layer's own format: its project directory is the image user's


def profile_script() -> str:
    """/etc/profile.d script: a login shell's /etc/profile resets PATH (Debian's drops the venv);
    enroot runs /etc/rc through a login shell by default and Pyxis takes the job's PATH from it."""
    return ("# raytrain: keep the image's venv first on PATH in login shells\n"
            f'case ":${{PATH}}:" in\n  *:{VENV}/bin:*) ;;\n  *) PATH="{VENV}/bin:${{PATH}}"; export PATH ;;\nesac\n')
LABEL_PREFIX = "io.raytrain"
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_./-]+")


def image_names(spec: ClusterSpec, variant: str, settings: Settings) -> tuple[str, str]:
    """(local repository, human tag) for a variant, from the spec's cpu_image / gpu_image.

    A registry in the name (`registry.example.com:5000/team/raytrain-cpu`) is where `push` sends it
    (pipeline.registry_address); locally the image is tagged by its repository path alone."""
    ref = ImageRef.parse(spec.cpu_image if variant == "cpu" else spec.gpu_image, f"{variant}_image")
    return ref.repository, ref.tag or f"{variant}-{settings.image.human_tag}"


def stage_repository(settings: Settings) -> str:
    """The engine's repository of the project's stages (user, deps, app: `Builder`)."""
    return f"{settings.image.repository}-stages"


def git_revision(root: Path) -> str:
    """HEAD's commit (the source revision label). Uncommitted edits are covered by the content keys.

    Also in a checkout another user owns (a CI runner's job user, a container's uid): git calls that
    "dubious ownership" and refuses, and the label would depend on who built. `safe.directory` for this
    one read of HEAD only; rev-parse runs no hook or configured program."""
    try:
        return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def registry_address(settings: Settings, spec: ClusterSpec, variant: str = "cpu") -> str:
    """Where push sends a variant: the spec's `registry`, else a registry named in its cpu_image/gpu_image,
    else registry.address."""
    named = ImageRef.parse(spec.cpu_image if variant == "cpu" else spec.gpu_image).registry
    return spec.registry or named or settings.registry.address


# -- what both ways of building (the engine's stages here, toolchain/image/registry_build.py without one) make alike
def deps_key(user_key: str, planned: list, python: Python, compiler: Optional[list]) -> str:
    """The deps stage's key: the user stage's and each dependency layer's (toolchain/image/venv_plan.py)."""
    return key_of("deps", user_key, [p.key for p in planned], python.version, python.executable, VENV,
                  venv_plan.FORMAT, layers.LAYER_FORMAT, compiler or bytecode.COMPILE)


def app_key(deps_key: str, sources: dict) -> str:
    return key_of("app", deps_key, sources["runtime_sha256"], sources["code_sha256"], layers.LAYER_FORMAT, APP_FORMAT)


def app_layer(settings: Settings) -> layers.Layer:
    """The runtime package and the user's code as one layer. The code's directory is the image user's, as a
    checkout is its user's: a script that writes beside itself (a plot, data, a checkpoint) can; the
    runtime stays root's."""
    app_dir = settings.path(settings.project.app_dir)
    if not app_dir.is_dir():
        raise ConfigError(f"project.app_dir: {app_dir} is not a directory; point it at your training code")
    user = settings.image.user
    return layers.make_layer(layers.files_under(settings.runtime_dir, f"{APP_ROOT}/runtime")
                             + layers.files_under(app_dir, PROJECT_DIR), owned={PROJECT_DIR: (user.uid, user.gid)})


def image_labels(settings: Settings, loaded: LoadedSpec, variant: str, torch_source: str) -> dict:
    """The labels the top (spec) layer's config adds."""
    repo, _ = image_names(loaded.model, variant, settings)
    return {
        "org.opencontainers.image.revision": git_revision(settings.root),
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.title": repo,
        f"{LABEL_PREFIX}.variant": variant,
        f"{LABEL_PREFIX}.spec-sha256": loaded.sha256,
        f"{LABEL_PREFIX}.cluster-name": loaded.model.cluster_name,
        f"{LABEL_PREFIX}.toolchain-version": __version__,
        f"{LABEL_PREFIX}.torch-source": torch_source,
    }


def config_fields(made_from: Optional[provenance.Provenance]) -> dict:
    """The top-level fields of this tool's own the top (spec) layer's config adds: the provenance."""
    return {provenance.FIELD: made_from.text()} if made_from is not None else {}


def user_stage_layer(settings: Settings, etc: user_layer.BaseEtc) -> layers.Layer:
    """The user stage's one layer on a base of ETC (toolchain/image/user_layer.py); UserLayerError naming what
    the base or the settings do not allow."""
    user = settings.image.user
    return user_layer.user_layer(etc, user.name, user.uid, user.gid, APP_ROOT, PROFILE_SCRIPT, profile_script())


def user_stage_config(settings: Settings, lower: dict, layer: layers.Layer) -> bytes:
    """The user stage's config: LOWER's (the base's, as the engine's inspect gives it) with LAYER on top."""
    user = settings.image.user
    return layers.image_config(
        lower, [*lower["RootFS"]["Layers"], layer.diff_id],
        env={"PATH": IMAGE_PATH, "VIRTUAL_ENV": VENV, "PYTHONPATH": IMAGE_PYTHONPATH, "PYTHONDONTWRITEBYTECODE": "1"},
        # numeric, so a kubelet can verify runAsNonRoot; enroot and Pyxis run as the submitting uid instead
        fields={"User": f"{user.uid}:{user.gid}", "WorkingDir": PROJECT_DIR,
                "Cmd": ["python", "-m", "runtime", "selfcheck"]})


def spec_key(app_key: str, spec_sha256: str, labels: dict, fields: dict) -> str:
    return key_of("spec", app_key, spec_sha256, labels, fields, SPEC_PATH_IN_IMAGE, layers.LAYER_FORMAT)


def spec_file_layer(loaded: LoadedSpec) -> layers.Layer:
    """The validated spec at CLUSTER_SPEC_PATH: the bytes that were validated."""
    return layers.make_layer([(SPEC_PATH_IN_IMAGE, loaded.raw, False)])


class Builder:
    def __init__(self, client: docker.DockerClient, settings: Settings, rep: Reporter):
        self.client, self.settings, self.rep = client, settings, rep
        self.stage_repo = stage_repository(settings)
        self.layer_store = layer_store(settings.build_dir)
        for token in (settings.image.user.name, settings.image.python):
            if not _SAFE_TOKEN.fullmatch(token):
                raise ConfigError(f"image settings: {token!r} must contain only letters, digits, '_', '.', '/', '-'")

    # -- helpers ------------------------------------------------------------------
    def python(self, base: BaseImage) -> Python:
        """The base's interpreter: its version (the wheelhouse's tags, pyvenv.cfg) and path (bin/python3)."""
        out = self.client.containers.run(base.ref, [self.settings.image.python, "-c", Python.PROBE], remove=True)
        return Python.parse(out.decode(), base.ref)

    def _build(self, stage: str, tag: str, context: Path, dockerfile: str, quiet: bool = False) -> str:
        (context / "Dockerfile").write_text(dockerfile)
        if not quiet:
            self.rep.step(f"{stage}: building {tag}")
        tail: list[str] = []
        image_id = None
        for chunk in self.client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, pull=False, decode=True):
            if "stream" in chunk:
                for line in chunk["stream"].splitlines():
                    if line.strip():
                        tail = (tail + [line])[-40:]
                        if not quiet and line.startswith(("Step ", "Installing collected", "Successfully installed")):
                            self.rep.detail(line.strip()[:160])
            if "error" in chunk:
                raise BuildError(stage, tag, chunk["error"].strip(), tail)
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
        if image_id is None:
            raise BuildError(stage, tag, "the engine reported no image id", tail)
        return image_id

    def _context(self) -> Path:
        ctx_root = self.settings.build_dir / "contexts"
        ctx_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=ctx_root))

    def _assemble(self, stage: str, ref: str, lower_ref: str, make, **config_kw) -> Optional[layers.Layer]:
        """The stage REF as LOWER_REF plus the layer MAKE gives (toolchain/image/layers.py); None when REF is
        already in the engine. Either way its layer and config end up in this build's layer store, where
        an incremental .sqsh and the push read them: a reused stage's are made again from the same files
        (same bytes, same diff ID, same config) and kept when they match."""
        lower = self.client.images.get(lower_ref).attrs

        def config_of(layer: layers.Layer) -> bytes:
            return layers.image_config(lower, [*lower["RootFS"]["Layers"], layer.diff_id], **config_kw)
        if image_exists(self.client, ref):
            self.rep.step(f"{stage}: reusing {ref}")
            image = self.client.images.get(ref)
            top = image.attrs["RootFS"]["Layers"][-1]
            if not (self.layer_store.has_tar(top) and self.layer_store.has_config(image.id)):
                layer = make()
                config = config_of(layer)
                if layer.diff_id == top:
                    layers.keep(layer, self.layer_store)
                if Digest.of(config) == image.id:
                    layers.keep_config(config, self.layer_store)
            return None
        layer = make()
        layers.load(self.client, [layer], config_of(layer), ref, self.layer_store)
        return layer

    # -- stages -------------------------------------------------------------------
    def user_stage(self, base: BaseImage) -> tuple[str, str]:
        """The user stage's tag and key (what `user` builds)."""
        user = self.settings.image.user
        key = key_of("user", base.key, user_layer.FORMAT, layers.LAYER_FORMAT, user.model_dump(),
                     self.settings.image.python, APP_ROOT, VENV, profile_script(), IMAGE_PATH, IMAGE_PYTHONPATH)
        return f"{self.stage_repo}:user-{key[:16]}", key

    def user(self, base: BaseImage, rebuilt: list, quiet: bool = False) -> tuple[str, str]:
        """The non-root user, its home, the app directory, the profile script, PATH and the default
        command: one layer written from the base's /etc (toolchain/image/user_layer.py), nothing run.
        QUIET: built beside the venv (`build`), whose progress has the terminal."""
        ref, key = self.user_stage(base)
        if image_exists(self.client, ref):
            if not quiet:
                self.rep.step(f"user: reusing {ref}")
            return ref, key
        try:
            layer = user_stage_layer(self.settings, user_layer.etc_of_image(self.client, base.ref))
        except user_layer.UserLayerError as e:
            raise BuildError("user", ref, f"{base.ref}: {e}", []) from None
        config = user_stage_config(self.settings, self.client.images.get(base.ref).attrs, layer)
        layers.load(self.client, [layer], config, ref, self.layer_store)
        rebuilt.append("user")
        return ref, key

    def deps(self, user_ref: str, user_key: str, user_job: Future, variant: str, python: Python,
             rebuilt: list, early: Optional[Future] = None) -> tuple[str, str, Wheelhouse, Optional[provenance.Provenance]]:
        """The user stage plus the dependency layers: one per wheel (or group of small wheels), each with
        its bytecode when the host's Python writes the image's, then the venv's top layer
        (toolchain/image/deps_stage.py). USER_JOB builds the user stage beside; only the layers the engine
        lacks are written and loaded. Otherwise the base's interpreter compiles the venv in a container
        and its .pyc go in one layer on top (toolchain/image/bytecode.py). EARLY: the wheelhouse for this
        Python, downloaded while the base was made (`build`)."""
        wh = early.result() if early is not None else ensure_wheelhouse(self.settings, variant, python.minor, self.rep)
        compiler = bytecode.identity(python.magic, python.cache_tag)
        wheels = venv_layer.wheels_of(wh.files, python.minor)
        sha256 = dict(zip(wh.wheels, wh.sha256))
        measured = {w.name: venv_plan.measure(w) for w in wheels}
        planned, overflow = venv_plan.plan(wheels, sha256, VENV, python.minor, compiler, measured)
        key = deps_key(user_key, planned, python, compiler)
        ref = f"{self.stage_repo}:deps-{key[:16]}"

        def facts(made: list) -> Optional[provenance.Provenance]:
            lower = len(self.client.images.get(user_job.result()[0]).attrs["RootFS"]["Layers"])
            if any(m is None for m in made):
                self.rep.detail("deps: a layer's index entry is gone; the image carries no provenance label "
                                "(a build elsewhere cannot reuse its layers)")
                return None
            return provenance.of_build(user_key, lower, python, compiler, VENV, sha256, measured, planned, made)
        if image_exists(self.client, ref):
            user_job.result()
            self.rep.step(f"deps: reusing {ref}")
            index = LayerIndex(default_index())
            entries = [index.get(p.key) for p in planned]
            return ref, key, wh, facts([(e["diff_id"], scripts_of(e)) if e else None for e in entries])
        if overflow:
            self.rep.warn(f"more than {venv_plan.MAX_OWN} big wheels: {', '.join(overflow)} share group layers")
        venv_layer.check_conflicts(wheels, python, VENV)
        self.rep.step(f"deps: {len(wheels)} wheels ({human_bytes(sum(p.size for p in planned))} unpacked) as "
                      f"{len(planned)} layers" + (", each with its bytecode compiled beside" if compiler else ""))
        t0 = time.monotonic()
        assembly = DepsAssembly(self.client, self.layer_store, planned, python, VENV, compiler is not None,
                                user_job, user_ref, ref, self.rep)
        if compiler is not None:
            assembly.run(ref)
        else:
            source = f"{ref}-source"
            attrs, _ = assembly.run(source)
            work = self._context()
            try:
                self.rep.step(f"deps: compiling the venv's modules with the image's {python.executable}")
                pyc, failed = bytecode.compiled_layer(self.client, source, VENV, work / "pyc")
                if failed:
                    self.rep.detail(f"{failed} module(s) did not compile (they compile at import, if imported)")
                layers.load(self.client, [pyc], layers.image_config(attrs, [*attrs["RootFS"]["Layers"], pyc.diff_id]),
                            ref, self.layer_store)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                if image_exists(self.client, source):
                    self.client.api.remove_image(source)
        self.rep.step(f"deps: assembled {ref} ({assembly.summary(time.monotonic() - t0)})")
        layers.prune_big(self.layer_store, keep={s.layer.path for s in assembly.slots if s.layer is not None})
        rebuilt.append("deps")
        return ref, key, wh, facts([(s.diff_id, s.scripts or []) for s in assembly.slots])

    def app(self, deps_ref: str, deps_key: str, sources: dict, rebuilt: list) -> tuple[str, str]:
        """The app stage: the deps stage and `app_layer`, assembled directly (toolchain/image/layers.py)."""
        key = app_key(deps_key, sources)
        ref = f"{self.stage_repo}:app-{key[:16]}"
        t0 = time.monotonic()
        layer = self._assemble("app", ref, deps_ref, lambda: app_layer(self.settings))
        if layer is not None:
            self.rep.step(f"app: assembled {ref} ({human_bytes(layer.size)} layer, {time.monotonic() - t0:.2f}s)")
            rebuilt.append("app")
        return ref, key

    def spec_layer(self, app_ref: str, app_key: str, loaded: LoadedSpec, variant: str, torch_source: str, rebuilt: list,
                   made_from: Optional[provenance.Provenance] = None):
        """The validated spec at CLUSTER_SPEC_PATH (the bytes that were validated) and the image's labels, as one layer."""
        spec, sha = loaded.model, loaded.sha256
        repo, human = image_names(spec, variant, self.settings)
        labels, fields = image_labels(self.settings, loaded, variant, torch_source), config_fields(made_from)
        ref = f"{repo}:{variant}-{spec_key(app_key, sha, labels, fields)[:16]}"
        if self._assemble("spec", ref, app_ref, lambda: spec_file_layer(loaded), env={SPEC_ENV: SPEC_PATH_IN_IMAGE},
                          labels=labels, extra=fields) is not None:
            self.rep.step(f"spec: assembled {ref}")
            rebuilt.append("spec")
        return ref, f"{repo}:{human}", sha

    def build(self, variant: str, loaded: LoadedSpec) -> BuildRecord:
        minor = suite_python(self.settings)
        # a requirement file that does not parse, or a conflict with the runtime's or the variant's torch:
        # said before any work (judged again for the base's own Python once it is known)
        image_set(self.settings, variant, minor or "3", self.settings.image.torch[variant].requirement)
        rebuilt: list = []
        # the wheelhouse downloads while debootstrap does, for the Python the suite ships (both wait on
        # the network); a base with another Python gets its own wheelhouse below
        with ThreadPoolExecutor(1, thread_name_prefix="wheelhouse") as fetching:
            early = fetching.submit(ensure_wheelhouse, self.settings, variant, minor, self.rep) if minor else None
            try:
                base = ensure_base(self.client, self.settings, self.rep)
                python = self.python(base)
            finally:
                if early is not None:
                    early.exception()  # waited for, its error said where it is used (or not needed)
        if python.minor != minor:
            early = None
        if base.built:
            rebuilt.append("base")
        user_ref, user_key = self.user_stage(base)
        if not image_exists(self.client, user_ref):
            self.rep.step(f"user: building {user_ref} beside the dependency layers")
        built: list = []
        with ThreadPoolExecutor(1, thread_name_prefix="user-stage") as pool:
            user_job = pool.submit(self.user, base, built, True)
            try:
                deps_ref, deps_key, wh, made_from = self.deps(user_ref, user_key, user_job, variant, python, rebuilt,
                                                              early)
            finally:
                user_job.exception()  # a build under way is waited for; its error, if deps did not say it, below
            user_job.result()
        if built:
            self.rep.step(f"user: built {user_ref}")
            rebuilt.insert(int(base.built), "user")
        sources = source_keys(self.settings)  # the trees hashed once: the app layer's key and the record's
        app_ref, app_key = self.app(deps_ref, deps_key, sources, rebuilt)
        ref, human_ref, sha = self.spec_layer(app_ref, app_key, loaded, variant, wh.torch_source, rebuilt, made_from)
        if self.settings.image.profile == SKYPILOT_PROFILE:
            ref, human_ref = skypilot_profile.add(self, ref, human_ref, user_ref, user_key, rebuilt)
        image = self.client.images.get(ref)
        return BuildRecord(variant=variant, local_ref=ref, human_ref=human_ref, image_id=image.id, spec_sha256=sha,
                           base_ref=base.ref, user_ref=user_ref, deps_ref=deps_ref, app_ref=app_ref, torch_source=wh.torch_source,
                           rebuilt=rebuilt, **sources)


SUITE_PYTHON = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}  # Debian's python3 in each suite


def suite_python(settings: Settings) -> Optional[str]:
    """The Python minor version a bootstrapped base will have (the suite's python3), when it is known
    before the base exists; None for a configured base image or another interpreter."""
    img = settings.image
    if img.base_image or img.python not in ("python3", "/usr/bin/python3"):
        return None
    return SUITE_PYTHON.get(img.bootstrap.suite)


def source_keys(settings: Settings) -> dict:
    """What the image's layers were made from, as `invoke run` compares it with the tree (toolchain/held.py):
    below the code (requirements, base, torch, image settings), the runtime package, and the code."""
    # the profile's layers go above the app's (toolchain/skypilot_profile.py): not below the code
    below = settings.image.model_dump(mode="json", exclude={"profile"})
    return {"below_app_key": key_of("below-app", requirements_key(settings), below),
            "runtime_sha256": tree_hash(settings.runtime_dir),
            "code_sha256": tree_hash(settings.path(settings.project.app_dir))}


def build_all(client: docker.DockerClient, settings: Settings, variants: list[str], loaded: LoadedSpec,
              rep: Reporter) -> list[BuildRecord]:
    """Build every variant; human tags are applied only once all of them built; then build.json."""
    builder = Builder(client, settings, rep)
    built = [builder.build(v, loaded) for v in variants]
    for b in built:
        client.api.tag(b.image_id, b.human_ref.name, b.human_ref.tag)
    write_builds(settings.build_dir, built)
    return built

"""The deps stage: the user stage plus one layer per wheel (or group of small wheels) and the venv's top layer.

[base, user..., wheel layers (toolchain/image/venv_plan.py's order), venv top, (bytecode, when the base's
Python compiles it)]. Three things run at once:
  - the writer (this thread) writes each layer that is not at hand to the layer store (toolchain/image/venv_layer.py
    `LayerWriter`), and finishes it once its bytecode, compiled meanwhile by `bytecode.HostCompiler` in
    worker interpreters, is ready; it goes on to the next layer in the meantime;
  - the loader (a thread) waits for the user stage (built beside, in another thread), then loads the
    layers into the engine in order, in batches of whatever is finished, each batch a docker-archive
    holding only its new layers on top of the previous batch (the engine applies one batch while the
    next is written);
  - the compiler's workers, at a lower priority.
A layer is "at hand" when its key is in the index (toolchain/image/venv_plan.py `LayerIndex`, shared by every
build directory): its diff ID is known and, unless the engine already holds the chain up to it, its tar
is in the store; a tar the push
dropped is written again (the same bytes: the writer is reproducible, and a different diff ID is said).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from deploy.layer_store import LayerStore
from toolchain.image import bytecode, layers, venv_layer
from toolchain.errors import BuildError
from toolchain.progress import Reporter, human_bytes
from toolchain.image.venv_layer import LayerWriter, Python
from toolchain.image.venv_plan import LayerIndex, PlannedLayer, default_index, scripts_of


@dataclass
class _Slot:
    """One planned layer on its way: its diff ID once known, its tar once needed and finished."""
    planned: PlannedLayer
    diff_id: Optional[str] = None
    layer: Optional[layers.FileLayer] = None
    scripts: Optional[list] = None


def engine_chains(client) -> list[list[str]]:
    """The layer chains of the engine's images, tagged or not."""
    return [(image.attrs.get("RootFS") or {}).get("Layers") or [] for image in client.images.list(all=True)]


def held_prefix(chains: list[list[str]], chain: list[str]) -> int:
    """How many of CHAIN's bottom layers the engine holds as a chain (CHAINS: `engine_chains`)."""
    best = 0
    for have in chains:
        n = 0
        while n < min(len(have), len(chain)) and have[n] == chain[n]:
            n += 1
        best = max(best, n)
    return best


class DepsAssembly:
    def __init__(self, client, store: LayerStore | Path, planned: list[PlannedLayer], python: Python, venv: str,
                 compile_on_host: bool, user_job: Future, user_ref: str, ref: str, rep: Reporter,
                 index: Optional[LayerIndex] = None):
        store = LayerStore.of(store)
        self.client, self.store, self.python, self.venv, self.rep = client, store, python, venv, rep
        self.compile_on_host, self.user_job, self.user_ref, self.ref = compile_on_host, user_job, user_ref, ref
        self.index = index or LayerIndex(default_index())
        self.slots = [_Slot(p) for p in planned]
        for s in self.slots:
            entry = self.index.get(s.planned.key, on_bad=rep.warn)
            if entry is not None:
                s.diff_id, s.scripts = entry["diff_id"], scripts_of(entry)
                size = store.tar_size(s.diff_id)
                if size is not None:
                    s.layer = layers.FileLayer(store.tar(s.diff_id), s.diff_id, size)
        self.prefix: Optional[int] = None  # of the wheel layers, those the engine holds on the user stage
        self.prefix_known = threading.Event()
        self.ready = threading.Condition()
        self.error: Optional[BaseException] = None
        self.stopping = False
        self.stats = {"written": 0, "written_bytes": 0, "loads": 0, "loaded_bytes": 0, "rewritten": 0,
                      "load_seconds": 0.0}

    # -- the writer --------------------------------------------------------------------------------
    def _needs_tar(self, i: int) -> bool:
        s = self.slots[i]
        if s.diff_id is None:
            return True
        if s.layer is not None:
            return False
        self.prefix_known.wait()
        if self.error is not None:
            raise BuildError("deps", self.ref, "the engine's load failed", [])
        return i >= self.prefix

    def _write_all(self, compiler: Optional[bytecode.HostCompiler]) -> None:
        # the total grows by each layer written again (its tar dropped by a push), known only when reached
        total = [sum(s.planned.size for s in self.slots if s.diff_id is None)]
        done_before = [0]
        open_: list[tuple[int, LayerWriter]] = []

        def progress(n: int) -> None:
            self.rep.progress("deps: writing the dependency layers" + (", loading them as they are done"
                                                                      if self.client is not None else ""),
                              done_before[0] + n, max(total[0], done_before[0] + n, 1))
        try:
            for i, s in enumerate(self.slots):
                if self.error is not None:
                    raise self.error
                if not self._needs_tar(i):
                    continue
                if s.diff_id is not None:
                    total[0] += s.planned.size
                if s.diff_id is not None and compiler is not None:  # dropped by the push: written again
                    compiler.add(venv_layer.planned_modules(list(s.planned.wheels), self.python, self.venv))
                planned = compiler.planned_of(s.planned.wheels) if compiler is not None else set()
                w = LayerWriter(list(s.planned.wheels), self.python, self.venv, self.store, planned, progress)
                open_.append((i, w))
                w.files()
                done_before[0] += w.out.size
                self._finish_ready(open_, compiler, block=False)
            self._finish_ready(open_, compiler, block=True)
        except BaseException:
            for _, w in open_:
                w.abort()
            raise
        finally:
            self.rep.progress_done()

    def _finish_ready(self, open_: list, compiler: Optional[bytecode.HostCompiler], block: bool) -> None:
        """Finish the open layers, bottom first, whose bytecode is ready (all of them, with BLOCK)."""
        while open_:
            i, w = open_[0]
            wheels = self.slots[i].planned.wheels
            if not block and compiler is not None and not compiler.done(wheels):
                return
            layer = w.finish(compiler, self.python.cache_tag)
            open_.pop(0)
            self._deliver(i, layer, w.out.scripts)

    def _deliver(self, i: int, layer: layers.FileLayer, scripts: list) -> None:
        s = self.slots[i]
        if s.diff_id is not None and s.diff_id != layer.diff_id:
            self.rep.warn(f"the layer of {s.planned.name} came out as {layer.diff_id.short}, not {s.diff_id.short} "
                          "as before: it is pushed again (the host's Python changed?)")
        self.stats["rewritten" if s.diff_id is not None else "written"] += 1
        self.stats["written_bytes"] += layer.size
        self.index.put(s.planned.key, layer.diff_id, layer.size, scripts)
        with self.ready:
            s.diff_id, s.layer, s.scripts = layer.diff_id, layer, scripts
            self.ready.notify_all()

    # -- the loader --------------------------------------------------------------------------------
    def _load_all(self, user_attrs: dict, top: Callable[[], layers.Layer], final_tag: str) -> dict:
        base_chain = user_attrs["RootFS"]["Layers"]
        known = []
        for s in self.slots:
            if s.diff_id is None:
                break
            known.append(s.diff_id)
        chains = engine_chains(self.client)
        self.prefix = max(0, held_prefix(chains, base_chain + known) - len(base_chain))
        if held_prefix(chains, base_chain) < len(base_chain):
            raise BuildError("deps", self.user_ref, "the user stage's layers are not in the engine", [])
        self.prefix_known.set()
        chain = base_chain + known[:self.prefix]
        i = self.prefix
        partial = f"{final_tag}-partial"
        previous: Optional[str] = None
        try:
            if i == len(self.slots):  # no wheels, or the engine holds every dependency layer (an image of
                t = top()               # them pulled from a registry): the top layer alone
                layers.load(self.client, [t], layers.image_config(user_attrs, chain + [t.diff_id]), final_tag,
                            self.store)
                self.stats["loads"] += 1
            while i < len(self.slots):
                with self.ready:
                    while self.slots[i].layer is None and self.error is None and not self.stopping:
                        self.ready.wait(0.5)
                if self.error is not None or self.stopping:
                    raise BuildError("deps", self.ref, "stopped: the writer failed", [])
                batch = []
                while i < len(self.slots) and self.slots[i].layer is not None:
                    chain = chain + [self.slots[i].diff_id]
                    if held_prefix(chains, chain) < len(chain):  # else the engine has it (a layer written
                        batch.append(self.slots[i].layer)     # again for want of an index entry): not sent
                    i += 1
                last = i == len(self.slots)
                if last:
                    t = top()
                    batch.append(t)
                    chain = chain + [t.diff_id]
                elif not batch:
                    continue
                config = layers.image_config(user_attrs, chain)
                tag = final_tag if last else partial
                t0 = time.monotonic()
                image_id = layers.load(self.client, batch, config, tag, self.store if last else None)
                self.stats["load_seconds"] += time.monotonic() - t0
                self.stats["loads"] += 1
                self.stats["loaded_bytes"] += sum(l.size for l in batch)
                if previous is not None and previous != image_id:
                    self._remove(previous)
                previous = None if last else image_id
        finally:
            if previous is not None:
                self._remove(previous)
        return self.client.images.get(final_tag).attrs

    def _remove(self, image_id: str) -> None:
        try:
            self.client.api.remove_image(image_id, force=True)
        except Exception:  # noqa: BLE001 - an untagged intermediate left behind costs only its config
            pass

    # -- both --------------------------------------------------------------------------------------
    def _compiler(self) -> Optional[bytecode.HostCompiler]:
        if not self.compile_on_host:
            return None
        to_compile = [w for s in self.slots if s.diff_id is None for w in s.planned.wheels]
        return bytecode.HostCompiler(planned=venv_layer.planned_modules(to_compile, self.python, self.venv))

    def write_only(self) -> None:
        """Write each layer whose tar is not at hand into the store, with no engine to load them into
        (toolchain/image/registry_build.py); each slot's diff ID and scripts are then known."""
        self.prefix = 0
        self.prefix_known.set()
        compiler = self._compiler()
        try:
            self._write_all(compiler)
        finally:
            if compiler is not None:
                compiler.close()

    def run(self, final_tag: str) -> tuple[dict, layers.Layer]:
        """Write and load; the attrs of FINAL_TAG (user + wheel layers + top) and the top layer."""
        compiler = self._compiler()
        result: dict = {}
        top_box: list = []

        def top() -> layers.Layer:
            scripts = [sc for s in self.slots for sc in (s.scripts or [])]
            top_box.append(venv_layer.top_layer(self.python, self.venv, scripts))
            return top_box[0]

        def loader() -> None:
            try:
                user_attrs = self.client.images.get(self.user_job.result()[0]).attrs
                result["attrs"] = self._load_all(user_attrs, top, final_tag)
            except BaseException as e:  # noqa: BLE001 - handed to the writer's thread below
                self.error = e
                self.prefix_known.set()
                with self.ready:
                    self.ready.notify_all()
        thread = threading.Thread(target=loader, name="deps-load", daemon=True)
        thread.start()
        try:
            self._write_all(compiler)
        except BaseException:
            self.stopping = True
            with self.ready:
                self.ready.notify_all()
            thread.join()
            raise
        finally:
            if compiler is not None:
                compiler.close()
        thread.join()
        if self.error is not None:
            raise self.error
        return result["attrs"], top_box[0]

    def summary(self, seconds: float) -> str:
        st = self.stats
        reused = len(self.slots) - st["written"] - st["rewritten"]
        again = f", {st['rewritten']} written again (its tar was dropped)" if st["rewritten"] else ""
        return (f"{len(self.slots)} wheel layers: {st['written']} new{again}, {reused} at hand; "
                f"{human_bytes(st['written_bytes'])} written; {st['loads']} load(s) into the engine, "
                f"{human_bytes(st['loaded_bytes'])} in {st['load_seconds']:.1f}s; {seconds:.1f}s in all")

"""One-line change -> first training step: a fresh deploy against a held cluster (invoke up once, then
invoke run), on the local target with N nodes, in the same run.

Both paths start from the same project, built and pushed once (not timed). Then, per round, the
same one-line change to train.py (a new marker in the worker's step line) and:
  fresh: build + push (the app layer only) + deploy --target local (new containers, Ray, barrier);
  held:  run on the cluster `up` started before the rounds (the code only, as Ray's working_dir).
The clock stops when the changed line of step 1 appears in the output. Medians over --rounds; the
ratio is fresh / held. `up` itself is timed once and printed apart (it is paid once per session).
Run: .venv/bin/python bench/warm_loop.py [--nodes 3 --rounds 3]   (needs the Docker engine)
"""
from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from conftest import SPEC, make_settings  # noqa: E402
from toolchain import held, pipeline  # noqa: E402
from toolchain.config import DeploySettings  # noqa: E402
from toolchain.progress import Reporter  # noqa: E402
from toolchain.registry import start_local, stop_local  # noqa: E402

LINE = 'print(f"step {self.step} loss {loss.item():.5f}", flush=True)'
COMMAND = "python train.py --steps 3 --cpus-per-worker 0.5 --no-spares"


class Watch(io.TextIOBase):
    """A stdout that notes when a line with the marker is first written."""

    def __init__(self, marker: str):
        self.marker, self.seen, self.t0 = marker, threading.Event(), time.monotonic()
        self.at = None

    def write(self, text: str) -> int:
        if self.at is None and self.marker in text and "step 1 loss" in text:
            self.at = time.monotonic() - self.t0
            self.seen.set()
        return len(text)


def change(app: Path, marker: str) -> None:
    train = app / "train.py"
    text = train.read_text()
    start = text.index('print(f"step {self.step} loss')
    end = text.index("\n", start)
    train.write_text(text[:start] + LINE.replace('.5f}"', '.5f} ' + marker + '"') + text[end:])


def timed(fn, marker: str) -> float:
    watch = Watch(marker)
    with redirect_stdout(watch):
        fn()
    if watch.at is None:
        raise RuntimeError(f"the changed line ({marker}) never appeared in step 1")
    return watch.at


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rep = Reporter(quiet=True)
    work = Path(tempfile.mkdtemp(prefix="warm-loop-"))
    app = work / "app"
    shutil.copytree(ROOT / "examples" / "train", app, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "runtime", work / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    s = make_settings(work / "proj", app, runtime_dir=work / "runtime")
    name = f"warm-{uuid.uuid4().hex[:6]}"
    s = s.model_copy(update={"deploy": DeploySettings(name=name, nodes=args.nodes,
                                                      command=COMMAND.split())})
    reg = start_local(s, rep)
    try:
        pipeline.build(s, str(SPEC), "cpu", rep)
        pipeline.push(s, str(SPEC), "cpu", rep)
        t0 = time.monotonic()
        held.up(s, str(SPEC), "local", rep=rep, name=name, nodes=args.nodes)
        up_s = time.monotonic() - t0
        fresh, warm = [], []
        try:
            for i in range(args.rounds):
                marker = f"FRESH{i}-{uuid.uuid4().hex[:4]}"
                change(app, marker)

                def fresh_path():
                    pipeline.build(s, str(SPEC), "cpu", rep)
                    pipeline.push(s, str(SPEC), "cpu", rep)
                    pipeline.deploy(s, str(SPEC), "local", rep=rep, name=f"{name}-f", nodes=args.nodes)
                fresh.append(timed(fresh_path, marker))
                marker = f"HELD{i}-{uuid.uuid4().hex[:4]}"
                change(app, marker)
                warm.append(timed(lambda: held.run(s, str(SPEC), rep=rep, name=name), marker))
                print(f"round {i + 1}: fresh {fresh[-1]:.2f} s, held {warm[-1]:.2f} s", flush=True)
        finally:
            held.down(s, rep=rep, name=name)
        f, w = statistics.median(fresh), statistics.median(warm)
        print(f"\none-line change -> first step, {args.nodes} local nodes, median of {args.rounds}:")
        print(f"  fresh deploy (build + push + deploy): {f:6.2f} s")
        print(f"  held cluster (invoke run):            {w:6.2f} s")
        print(f"  ratio fresh/held:                     {f / w:6.1f}x")
        print(f"  (invoke up, once: {up_s:.2f} s)")
    finally:
        if reg.started_here:
            stop_local(s)
            shutil.rmtree(s.registry.data_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

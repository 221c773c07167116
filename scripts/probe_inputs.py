"""A hostile-input probe of the command line, as a new user would meet it: flags, INVOKE_* variables,
configuration files, spec files, recorded files, --out paths, the launcher's flags and the
schedulers' variables. Every case runs `raytrain`/`python -m runtime` as a subprocess in a scratch
project directory and is classed:

  traceback      a Python traceback reached the user
  hang           no answer within the time limit
  silent         a value that must be refused was accepted (exit 0)
  over-refused   a valid value was refused
  injection      a shell metacharacter in a value ran something (a canary file appeared)
  write-on-fail  a refused command left files behind
  ok             refused with exit 2 and one message, or accepted as it should be

Prints one line per case that is not ok, then the counts by class. No engine, registry or cluster
is needed: deploys are dry runs or write files only. Run: .venv/bin/python scripts/probe_inputs.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAYTRAIN = [sys.executable, "-m", "toolchain.cli"]
RUNTIME = [sys.executable, "-m", "runtime"]
TIMEOUT_S = 60

BAD_WHOLE = ["²", "٣", "１", "1_0", " 7", "7\n", "-1", "nan", "inf", "1e3", "9" * 25, "0x10", "", "7 ", "+7", "३"]
BAD_FLOAT = ["nan", "NaN", "inf", "-inf", "1e308", "1e999", "١٫٥", "1_0", "", "--1", "0x1p3"]
HOSTILE_TEXT = ["", " ", "a\nb", "x" * 300, "$(touch {canary})", "`touch {canary}`", "a; touch {canary}", "-rf",
                "ä", "a\tb", "../../etc", "%j%x"]


def images_json(spec: Path) -> str:
    """build/images.json as `invoke push` writes it, for images built with SPEC (fake digests)."""
    import hashlib
    sha = hashlib.sha256(spec.read_bytes()).hexdigest()
    return json.dumps({v: {"repo_digest": f"registry.example.com:5000/raytrain-{v}@sha256:{c * 64}", "spec_sha256": sha,
                           "spec_file": str(spec), "registry": "registry.example.com:5000", "registry_scheme": "https",
                           "user": "1000:1000", "local_ref": f"raytrain-{v}:x", "image_id": "sha256:" + "9" * 64,
                           "digest": f"sha256:{c * 64}"} for v, c in (("cpu", "1"), ("gpu", "2"))})


def cases(canary: str):
    """(name, argv, env, files, expect); files are written into the case's directory; expect is
    'refuse' or 'accept'. '{dir}' and '{canary}' in argv, env and file texts are filled in."""
    def t(v: str) -> str:
        return v.replace("{canary}", canary)
    slurm = ["deploy", "--target", "slurm", "--dry-run"]
    for flag in ("--nodes", "--gpus", "--port-stride", "--spare-nodes"):
        for v in BAD_WHOLE:
            yield f"flag {flag}={v!r}", [*slurm, flag, v], {}, {}, "refuse"
        yield f"flag {flag}=2", [*slurm, flag, "2"], {}, {}, "accept"
    yield "flag --nodes=0", [*slurm, "--nodes", "0"], {}, {}, "refuse"
    for flag in ("--name", "--partition", "--account", "--target", "--spec", "--out"):
        for v in HOSTILE_TEXT:
            # --out is a path: any non-empty text is a name (never run through a shell)
            expect = "accept" if (flag == "--out" and v.strip() and len(v) < 256) else "refuse"
            argv = ["deploy", "--target", "slurm", flag, t(v)] if flag != "--target" else ["deploy", flag, t(v), "--dry-run"]
            if flag == "--out" and expect == "accept":  # written for real: inside the case's directory
                argv[-1] = "{dir}/x/../../etc-out" if v == "../../etc" else "{dir}/" + t(v)
            yield f"flag {flag}={v[:30]!r}", argv, {}, {}, expect
    for v in ("python 'unclosed", "", "   ", "python train.py $(touch {canary})", "python train.py; touch {canary}"):
        yield (f"flag --command={v[:30]!r}", ["deploy", "--target", "slurm", "--command", t(v)], {}, {},
               "accept" if "train.py" in v else "refuse")
    for out in ("/proc/raytrain-probe", "/sys/raytrain-probe/x", "{dir}/afile/sub", "{dir}/" + "n" * 300):
        yield f"--out {out[:40]}", ["deploy", "--target", "slurm", "--out", out], {}, {"afile": "x"}, "refuse"
    yield "--out onto a directory named like the artifact", ["deploy", "--target", "slurm", "--out", "{dir}/o"], {}, \
        {"o/example.sbatch/keep": "x"}, "refuse"
    for seeds in ("²", "1-100000", "3-1", "1,,2", "1-4", "nan", "-1"):
        # a comma- or space-separated list: an empty item between commas is no seed, not an error
        yield (f"k8s --seeds={seeds!r}", ["deploy", "--target", "k8s", "--spec", str(ROOT / "cluster_specs/kubernetes.json"),
                                          "--seeds", seeds, "--dry-run"], {}, {}, "accept" if seeds in ("1-4", "1,,2") else "refuse")
    for var, values in (("INVOKE_DEPLOY_NODES", BAD_WHOLE), ("INVOKE_DEPLOY_PORT_BASE", BAD_WHOLE),
                        ("INVOKE_REGISTRY_RETRY_BACKOFF_S", BAD_FLOAT), ("INVOKE_REGISTRY_STALL_TIMEOUT_S", BAD_FLOAT),
                        ("INVOKE_QUIET", ["maybe", "2", "tru", "yes please"]),
                        ("INVOKE_REGISTRY_START_LOCAL", ["maybe", "-1"]), ("INVOKE_DEPLOY_COMMAND", ["python x.py"])):
        for v in values:
            yield f"env {var}={v!r}", slurm, {var: v}, {}, "refuse"
    for var, v in (("INVOKE_QUIET", "false"), ("INVOKE_QUIET", "TRUE"), ("INVOKE_DEPLOY_NODES", "2"),
                   ("INVOKE_REGISTRY_RETRY_BACKOFF_S", "0.5")):
        yield f"env {var}={v!r}", slurm, {var: v}, {}, "accept"
    configs = {
        "yaml syntax": "deploy:\n  nodes: [\n", "list for a mapping": "deploy: [1, 2]\n", "top-level list": "- a\n- b\n",
        "nodes: true": "deploy:\n  nodes: true\n", "nodes: '2'": "deploy:\n  nodes: '2'\n", "nodes: .nan": "deploy:\n  nodes: .nan\n",
        "backoff .inf": "registry:\n  retry_backoff_s: .inf\n", "unknown key": "deploy:\n  nodez: 2\n",
        "duplicate key": "deploy:\n  nodes: 0\n  nodes: 2\n", "nodes: 1e3": "deploy:\n  nodes: 1e3\n",
        "quiet: maybe": "quiet: maybe\n", "command as text": "deploy:\n  command: python x.py\n",
    }
    for label, text in configs.items():
        yield f"-f config: {label}", ["-f", "{dir}/c.yaml", *slurm], {}, {"c.yaml": text}, "refuse"
    yield "-f config: quiet: 'no' (a boolean)", ["-f", "{dir}/c.yaml", *slurm], {}, {"c.yaml": "quiet: 'no'\n"}, "accept"
    yield "-f config: missing file", ["-f", "{dir}/none.yaml", *slurm], {}, {}, "refuse"
    yield "-f config: .txt", ["-f", "{dir}/c.txt", *slurm], {}, {"c.txt": "deploy: {}\n"}, "refuse"
    yield "-f config: valid", ["-f", "{dir}/c.yaml", *slurm], {}, {"c.yaml": "deploy:\n  nodes: 2\n"}, "accept"
    good = json.loads((ROOT / "cluster_specs" / "slurm.json").read_text())

    def spec(**changes) -> str:
        return json.dumps({**good, **changes})
    specs = {
        "duplicate key, first invalid": json.dumps({**good, "cluster_type": "mainframe"})[:-1] + ', "cluster_type": "slurm"}',
        "NaN": spec(slurm={"gpus_per_node": 0})[:-1] + ', "x": NaN}',
        "partition with newline": spec(slurm={"partition": "gpu\n"}),
        "partition of 100": spec(slurm={"partition": "p" * 100}),
        "partition with $()": spec(slurm={"partition": "$(touch {canary})"}),
        "gpus '٣'": spec(slurm={"gpus_per_node": "٣"}), "gpus true": spec(slurm={"gpus_per_node": True}),
        "gpus 1e3": spec(slurm={"gpus_per_node": 1e3}), "deep nesting": "[" * 100000, "empty": "",
        "latin-1": None, "lookbehind pattern": spec(node_type_from_node_name={"(?<=a)b": "cpu"}),
        "backtracking pattern": spec(node_type_from_node_name={"(a+)+$": "cpu"}),
        "fileroot with space": spec(fileroot="/a b"), "fileroot relative": spec(fileroot="rel"),
        "cluster_name with newline": spec(cluster_name="a\nb"),
    }
    for label, text in specs.items():
        files = {"s.json": text if text is not None else b"{\"cluster_type\": \"\xe9\"}"}
        expect = "accept" if label == "backtracking pattern" else "refuse"
        yield f"spec: {label}", ["spec.check", "{dir}/s.json"], {}, files, expect
    yield "spec: a directory", ["spec.check", "{dir}"], {}, {}, "refuse"
    yield "spec: /dev/zero", ["spec.check", "/dev/zero"], {}, {}, "refuse"
    yield "spec: /proc/self/mem", ["spec.check", "/proc/self/mem"], {}, {}, "refuse"
    yield "spec: a FIFO", ["spec.check", "{dir}/fifo"], {}, {"fifo": None}, "refuse"
    local = ["deploy", "--target", "local", "--dry-run"]
    records = {"duplicate key": '{"cpu": {}, "cpu": {}}', "NaN": '{"cpu": NaN}', "truncated": '{"cpu": {',
               "a list": "[1]", "wrong types": '{"cpu": {"repo_digest": 5}}', "not UTF-8": b"\xff\xfe{}"}
    for label, text in records.items():
        yield f"images.json: {label}", local, {}, {"build/images.json": text}, "refuse"
    yield "images.json: a directory", local, {}, {"build/images.json/x": "y"}, "refuse"
    launch = ["launch", "--no-auth", "--"]
    for flag, v in (("--port-stride", "-1"), ("--port-stride", "²"), ("--barrier-timeout", "nan"),
                    ("--join-timeout", "inf"), ("--barrier-timeout", "0"), ("--num-cpus", "0"), ("--port-base", "70000"),
                    ("--warm-hosts", "1_0"), ("--num-gpus", "-1"), ("--port-base", "")):
        yield f"launch {flag}={v!r}", ["@runtime", "launch", flag, v, "--", "true"], {}, {}, "refuse"
    slurm_env = {"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-3]"}
    for extra in ({"SLURM_NNODES": "0"}, {"SLURM_NNODES": "٣"}, {"SLURM_NODEID": "²"}, {"SLURM_GPUS_ON_NODE": "gpu:١"},
                  {"SLURM_JOB_NODELIST": "n[3-1]"}, {"SLURM_JOB_NODELIST": ""}, {"SLURM_NNODES": "5"}):
        yield f"launch with {extra}", ["@runtime", *launch, "true"], {**slurm_env, **extra}, {}, "refuse"
    for extra in ({"SKYPILOT_NUM_NODES": "0"}, {"SKYPILOT_NUM_NODES": "3"}, {"SKYPILOT_NODE_RANK": "x"}):
        env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2", **extra}
        yield f"launch with {extra}", ["@runtime", *launch, "true"], env, {}, "refuse"
    yield "run without a serving head", ["@runtime", "run", "--code-dir", "{dir}", "--", "python", "x.py"], \
        {"RAYTRAIN_JOB_NAME": "probe-none"}, {}, "refuse"
    for option, value in (("call_timeout_s", "float('nan')"), ("max_restarts", "True"), ("memory_limit", "-5"),
                          ("colocated_share", "2.0"), ("init_timeout_s", "float('inf')")):
        code = (f"from runtime.workers.worker_group import RayWorkerGroup\nimport sys\ntry:\n    RayWorkerGroup(None, object, "
                f"{option}={value})\nexcept ValueError as e:\n    print(e, file=sys.stderr); sys.exit(2)\n")
        yield f"worker group {option}={value}", ["@python", "-c", code], {}, {}, "refuse"


def run_case(base: Path, canary: str, name, argv, env, files, expect) -> str:
    d = Path(tempfile.mkdtemp(prefix="case-", dir=base))
    (d / "build").mkdir()
    spec_file = ROOT / "cluster_specs" / "local.json"
    (d / "build" / "images.json").write_text(images_json(spec_file))
    for rel, text in files.items():
        p = d / rel
        if p.parent == d / "build" / "images.json":  # the record is a directory in this case
            p.parent.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            os.mkfifo(p)
        elif isinstance(text, bytes):
            if p.exists() and p.is_dir():
                continue
            p.write_bytes(text)
        else:
            p.write_text(text.replace("{canary}", canary))
    argv = [a.replace("{dir}", str(d)) for a in argv]
    if argv and argv[0] == "@runtime":
        cmd = [*RUNTIME, *argv[1:]]
    elif argv and argv[0] == "@python":
        cmd = [sys.executable, *argv[1:]]
    else:
        cmd = [*RAYTRAIN, *argv]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_PROJECT_BUILD_DIR": str(d / "build"),
                **{k: v.replace("{canary}", canary) for k, v in env.items()}}
    if "--spec" not in argv and argv and argv[0] not in ("@runtime", "@python") and "spec.check" not in argv:
        full_env.setdefault("INVOKE_PROJECT_SPEC", str(ROOT / "cluster_specs" / ("slurm.json" if "slurm" in argv else "local.json")))
        if "slurm" in argv:
            (d / "build" / "images.json").write_text(images_json(ROOT / "cluster_specs" / "slurm.json"))
        if "k8s" in argv:
            (d / "build" / "images.json").write_text(images_json(ROOT / "cluster_specs" / "kubernetes.json"))
    if "k8s" in argv:
        (d / "build" / "images.json").write_text(images_json(ROOT / "cluster_specs" / "kubernetes.json"))
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    try:
        r = subprocess.run(cmd, cwd=d, env=full_env, capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "hang"
    after = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    if Path(canary).exists():
        Path(canary).unlink()
        return "injection"
    if "Traceback" in r.stderr:
        return "traceback"
    if expect == "refuse" and r.returncode == 0:
        return "silent"
    if expect == "accept" and r.returncode != 0:
        return "over-refused"
    if r.returncode != 0 and after != before:
        return "write-on-fail"
    if expect == "refuse" and r.returncode != 2:
        return "ok" if r.returncode in (1, 2) and "error" in r.stderr.lower() else "silent"
    return "ok"


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="probe-"))
    canary = str(base / "CANARY")
    counts: Counter = Counter()
    try:
        all_cases = list(cases(canary))
        for name, argv, env, files, expect in all_cases:
            outcome = run_case(base, canary, name, argv, env, files, expect)
            counts[outcome] += 1
            if outcome != "ok":
                print(f"{outcome:14} {name}", flush=True)
        print(f"\n{len(all_cases)} cases: " + ", ".join(f"{k} {counts[k]}" for k in
              ("ok", "traceback", "hang", "silent", "over-refused", "injection", "write-on-fail")))
    finally:
        subprocess.run(["rm", "-rf", str(base)])
    return 0 if counts["ok"] == sum(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

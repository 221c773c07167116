"""A hostile-input probe of the command line, as a new user would meet it: flags, INVOKE_* variables,
configuration files, spec files, recorded files, --out paths, the launcher's flags and the
schedulers' variables. Every case runs `raytrain`/`python -m runtime` as a subprocess in a scratch
project directory and is classed:

  traceback      a Python traceback reached the user
  hang           no answer within the time limit
  silent         a value that must be refused was accepted (exit 0)
  over-refused   a valid value was refused
  injection      a shell metacharacter in a value ran something, or a file was written outside
                 where it belongs (a canary file appeared, a file outside changed)
  escape         a recorded value reached a scheduler tool (its argv is logged by a stand-in)
  write-on-fail  a refused command left files behind or changed one
  harness        refused for want of a project, not for the value (the probe's own fault)
  ok             refused with exit 2 and one message, or accepted as it should be

Prints one line per case that is not ok, then the counts by outcome and by input class. No engine,
registry or cluster is needed: deploys are dry runs or write files only, and the scheduler tools
(squeue, scancel, srun, sbatch, sky, kubectl) are stand-ins on PATH that log their argv. Run: .venv/bin/python scripts/probe_inputs.py [CLASS], CLASS a part of a class's name ("tar").
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
            # (one that starts with '-' reads as an option given without its value: refused)
            expect = "accept" if (flag == "--out" and v.strip() and len(v) < 256 and not v.startswith("-")) else "refuse"
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
    for v in ("", "  ", "build\nx", "\x7f"):
        yield f"env INVOKE_PROJECT_BUILD_DIR={v!r}", ["status"], {"INVOKE_PROJECT_BUILD_DIR": v}, {}, "refuse"
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


REL = "raytrain-code/abc"


def tar_of(*members, fmt=None) -> bytes:
    """(name, type, payload-or-linkname[, mode, uid]) members, as an attacker would write them."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt or tarfile.PAX_FORMAT) as tf:
        for name, kind, extra, *more in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if more:
                info.mode = more[0]
            if len(more) > 1:
                info.uid, info.uname = more[1], "root"
            if kind == tarfile.REGTYPE:
                info.size = len(extra)
                tf.addfile(info, io.BytesIO(extra))
            else:
                info.linkname = extra or ""
                tf.addfile(info)
    return buf.getvalue()


def tar_cases(canary: str):
    """The code tar `invoke run` sends to a held cluster's head, through the real
    `python -m runtime run --unpack-stdin`: links, traversal, bombs, truncation."""
    import gzip
    import tarfile
    F, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
    good = tar_of((REL, D, None), (f"{REL}/train.py", F, b"print(1)\n"))
    # d/outside.txt, beside the root d/root: its bytes must not change (a hard link's name is from the root)
    bad = {
        "symlink to the probe's directory, then a file through it": tar_of((f"{REL}/l", S, str(Path(canary).parent)),
                                                                         (f"{REL}/l/CANARY", F, b"x")),
        "symlink chain . / .. / absolute": tar_of((f"{REL}/a", S, "."), (f"{REL}/a/b", S, ".."),
                                                (f"{REL}/a/b/c", S, str(Path(canary).parent)), (f"{REL}/a/b/c/CANARY", F, b"x")),
        "hard link to a file outside, then written": tar_of((f"{REL}/h", H, "../outside.txt"), (f"{REL}/h", F, b"overwritten")),
        "symlink to a file outside, then written": tar_of((f"{REL}/s", S, "../../../outside.txt"),
                                                                   (f"{REL}/s", F, b"overwritten")),
        "the code directory as a link to /etc": tar_of(("raytrain-code", D, None), (REL, S, "/etc")),
        "absolute name": tar_of((canary, F, b"x")),
        "climbs with ..": tar_of((f"{REL}/../../../CANARY", F, b"x")),
        "outside the run's directory": tar_of(("raytrain-code/other/x.py", F, b"x")),
        "a FIFO": tar_of((f"{REL}/p", tarfile.FIFOTYPE, None)),
        "a device": tar_of((f"{REL}/d", tarfile.CHRTYPE, None)),
        "a name twice": tar_of((f"{REL}/x", F, b"1"), (f"{REL}/x", F, b"2")),
        "a file then a directory of its name": tar_of((f"{REL}/x", F, b"1"), (f"{REL}/x", D, None)),
        "a name too long": tar_of((f"{REL}/{'n' * 300}", F, b"1")),
        "cut inside a member": good[:700],
        "only one of the two end-of-archive blocks": good[:2048],
        "no end-of-archive blocks": good[:1536],
        "not a tar": b"junk" * 200,
        "a gzip bomb (2 GiB of zeros)": gzip.compress(b"\0" * (64 << 20), 1),
        "60,000 members": tar_of(*[(f"{REL}/f{i}", F, b"") for i in range(60_000)], fmt=tarfile.GNU_FORMAT),
        "a member declaring 2 GiB": tar_of((f"{REL}/big", F, b"x"))[:512].replace(b"00000000001", b"20000000000") + b"\0" * 1024,
        "a 50 GiB sparse member": None,
        "nothing under the directory": tar_of(("raytrain-code", D, None)),
    }
    sparse = bytearray(tar_of((f"{REL}/s", F, b""), fmt=tarfile.GNU_FORMAT)[:512])
    sparse[156:157] = tarfile.GNUTYPE_SPARSE
    bad["a 50 GiB sparse member"] = bytes(sparse) + b"\0" * 1024
    argv = ["@runtime", "run", "--code-dir", "{dir}/root/" + REL, "--unpack-stdin", "{dir}/root", "--", "true"]
    for label, data in bad.items():
        yield f"tar: {label}", argv, {}, {"root/.keep": "", "outside.txt": "mine"}, "refuse", {"stdin": data}
    # accepted, but as data: modes and owners are the unpacking user's, not the tar's
    check = ("import io, os, stat, sys\nfrom pathlib import Path\nfrom runtime.cluster import code_unpack\n"
             "root = Path(sys.argv[1])\ncode_unpack.unpack(root, root / sys.argv[2], io.BytesIO(sys.stdin.buffer.read()))\n"
             "for p in [root / sys.argv[2], *(root / sys.argv[2]).rglob('*')]:\n"
             "    st = p.lstat()\n"
             "    if st.st_mode & 0o7022 or st.st_uid != os.getuid(): sys.exit(f'{p}: mode {oct(st.st_mode)} uid {st.st_uid}')\n")
    lax = tar_of((REL, D, None, 0o777, 0), (f"{REL}/run.sh", F, b"#!/bin/sh\n", 0o6777, 0), (f"{REL}/w", F, b"", 0o666, 0))
    yield "tar: world-writable, setuid and foreign owners (kept?)", ["@python", "-c", check, "{dir}/root", REL], {}, {}, \
        "accept", {"stdin": lax}
    for name in ("../../x", "a/b", "-rf", "a\nb", "x" * 100):
        yield (f"tar: RAYTRAIN_JOB_NAME={name[:20]!r} (a socket path)", ["@runtime", "run", "--code-dir", "{dir}", "--",
               "true"], {"RAYTRAIN_JOB_NAME": name}, {}, "refuse")


SHA = "0" * 64
SLURM = {"job_id": "42", "head_node": "n1", "log": "/tmp/raytrain/logs/job-42.out", "job_name": "job"}
SKY = {"cluster": "job", "job_id": "1", "nodes": 2, "job_name": "job"}
K8S = {"namespace": "default", "job_name": "job", "head_pod": "job-head-0"}


def _cluster(target: str, handle: dict, name: str = "job", **more) -> dict:
    rec = {"name": name, "target": target, "image": "x", "variant": "cpu", "spec_sha256": SHA, "below_app_key": "k",
           "runtime_sha256": "r", "project": str(ROOT), "started": "now", "handle": handle}
    return {**rec, **more}


def record_cases(canary: str):
    """build/clusters.json and build/runs.json as a careless user or an attacker leaves them, through
    the real status/down/run: every value that reaches a scheduler tool is checked when read."""
    bad = {
        "job id --user=root": ("slurm", {**SLURM, "job_id": "--user=root"}),
        "job id with spaces": ("slurm", {**SLURM, "job_id": "42 43"}),
        "head node -w": ("slurm", {**SLURM, "head_node": "-w"}),
        "head node with a newline": ("slurm", {**SLURM, "head_node": "n1\nn2"}),
        "job name ,LD_PRELOAD=": ("pyxis", {**SLURM, "job_name": "job,LD_PRELOAD=/x.so"}),
        "log path relative": ("slurm", {**SLURM, "log": "../x"}),
        "sky cluster -a": ("skypilot", {**SKY, "cluster": "-a"}),
        "sky job id 'all'": ("skypilot", {**SKY, "job_id": "all"}),
        "sky nodes '2'": ("skypilot", {**SKY, "nodes": "2"}),
        "k8s namespace --all-namespaces": ("k8s", {**K8S, "namespace": "--all-namespaces"}),
        "k8s head pod $(touch)": ("k8s", {**K8S, "head_pod": "$(touch {canary})"}),
        "local network host": ("local", {"network": "host", "head": "job-head-1", "containers": ["job-head-1"],
                                         "aliases": []}),
        "local containers not ours": ("local", {"network": "job-net", "head": "job-head-1",
                                                "containers": ["job-head-1", "registry"], "aliases": []}),
        "missing job id": ("slurm", {k: v for k, v in SLURM.items() if k != "job_id"}),
        "empty handle": ("slurm", {}),
        "unknown handle field": ("slurm", {**SLURM, "extra": "x"}),
        "a list for a name": ("k8s", {**K8S, "head_pod": ["a"]}),
        "a target that holds nothing": ("plain", {}),
    }
    for label, (target, handle) in bad.items():
        text = json.dumps({"job": _cluster(target, handle)})
        for cmd in (["status"], ["down", "--name", "job"], ["run", "--name", "job"]):
            yield f"clusters.json: {label} ({cmd[0]})", cmd, {}, {"build/clusters.json": text}, "refuse"
    shaped = {"empty record": {"job": {}}, "a string for the record": {"job": "x"},
              "name failing the check": {"Job!": _cluster("slurm", SLURM, name="Job!")},
              "filed under another name": {"job": _cluster("slurm", SLURM, name="other")},
              "target with a space": {"job": _cluster("slurm x", SLURM)},
              "a list for the file": [1], "truncated": None}
    for label, data in shaped.items():
        text = '{"job": {' if data is None else json.dumps(data)
        for cmd in (["status"], ["down", "--name", "job"]):
            yield f"clusters.json: {label} ({cmd[0]})", cmd, {}, {"build/clusters.json": text}, "refuse"
    for what in ("a FIFO", "a directory", "a dangling link", "a link to /dev/zero"):
        files = {"a FIFO": {"build/clusters.json": None}, "a directory": {"build/clusters.json/x": "y"},
                 "a dangling link": {"build/clusters.json": ("link", "{dir}/missing")},
                 "a link to /dev/zero": {"build/clusters.json": ("link", "/dev/zero")}}[what]
        yield f"clusters.json: {what} (status)", ["status"], {}, files, "refuse"
    for what, target in (("a link to /dev/zero", "/dev/zero"), ("a dangling link", "{dir}/missing")):
        yield (f"runs.json: {what} (deploy)", ["deploy", "--target", "slurm", "--out", "{dir}/out"], {},
               {"build/runs.json": ("link", target)}, "refuse")
    # a run whose step fails on the cluster: runs.json is as it was
    yield ("runs.json: a held run whose srun step exits 5", ["run", "--name", "job"], {"@held-run": "1"},
           {"build/runs.json": json.dumps({})}, "refuse", {"tools_may_run": True})


def launcher_env_cases(canary: str):
    """The launcher's environment, parsed like flags: numbers strict, addresses IPs or DNS names,
    names one line."""
    launch = ["@runtime", "launch", "--no-auth", "--join-timeout", "1", "--", "true"]
    slurm = {"SLURM_JOB_ID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-3]"}
    for extra in ({"SLURM_NNODES": " 3"}, {"SLURM_NNODES": "3 "}, {"SLURM_NODEID": "1\n"}, {"SLURM_NNODES": "+3"},
                  {"SLURM_JOB_NODELIST": "n1,-w,n3"}, {"SLURM_JOB_NODELIST": "n 1,n2"},
                  {"SLURM_JOB_NODELIST": "$(touch {canary}),n2"}, {"SLURMD_NODENAME": "n1\nERROR forged"}):
        yield f"launcher env {extra}", launch, {**slurm, **extra}, {}, "refuse"
    base = {"RAYTRAIN_NODE_RANK": "1", "RAYTRAIN_NUM_NODES": "2"}
    for head in ("10.0.0.1 10.0.0.2", "a\nb", "$(touch {canary})", "-rf", "http://10.0.0.1:6379", "", " 10.0.0.1",
                 "x" * 300, "a..b"):
        yield f"launcher env RAYTRAIN_HEAD_ADDRESS={head[:24]!r}", launch, {**base, "RAYTRAIN_HEAD_ADDRESS": head}, {}, "refuse"
    for ip in ("a b", "-x", "10.0.0.1\n", "$(id)", "http://h"):
        yield (f"launcher --node-ip={ip!r}", ["@runtime", "launch", "--no-auth", "--node-ip", ip, "--", "true"],
               {**base, "RAYTRAIN_HEAD_ADDRESS": "10.0.0.1"}, {}, "refuse")
    sky = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"}
    for ips in ("10.0.0.1\n-x", "10.0.0.1\n$(touch {canary})", "10.0.0.1\nhttp://x"):
        yield f"launcher env SKYPILOT_NODE_IPS={ips!r}", launch, {**sky, "SKYPILOT_NODE_IPS": ips}, {}, "refuse"
    yield ("launcher env RAYTRAIN_NODE_NAME with a newline", launch,
           {**base, "RAYTRAIN_HEAD_ADDRESS": "10.0.0.1", "KUBERNETES_SERVICE_HOST": "k", "JOB_COMPLETION_INDEX": "1",
            "RAYTRAIN_NODE_NAME": "n1\nforged"}, {}, "refuse")


def yaml_cases(canary: str):
    """Configuration files through `raytrain`'s one loader: a user's ~/.invoke.yaml and `-f FILE`."""
    slurm = ["deploy", "--target", "slurm", "--dry-run"]
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "unused: *i\n"
    texts = {"alias bomb": bomb, "5,000-deep list": "x: " + "[" * 5000 + "]" * 5000 + "\n",
             "5,000-deep mapping": "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",
             "sexagesimal 1:30": "deploy:\n  nodes: 1:30\n", "a 2 MiB file": "# " + "x" * (2 << 20) + "\n",
             "tab indentation": "deploy:\n\tnodes: 2\n", "a binary tag": "deploy: !!binary aGk=\n",
             "a python tag": "deploy: !!python/object/apply:os.system ['touch {canary}']\n",
             "merge key into deploy": "base: &b {nodes: 0}\ndeploy:\n  <<: *b\n",
             "not UTF-8": None}
    for label, text in texts.items():
        body = b"deploy: {nodes: \xff}\n" if text is None else text
        yield f"yaml: -f with {label}", ["-f", "{dir}/c.yaml", *slurm], {}, {"c.yaml": body}, "refuse"
        yield f"yaml: ~/.invoke.yaml with {label}", slurm, {"HOME": "{dir}"}, {".invoke.yaml": body}, "refuse"
    yield "yaml: ~/.invoke.yaml a FIFO", slurm, {"HOME": "{dir}"}, {".invoke.yaml": None}, "refuse"
    yield "yaml: ~/.invoke.yaml valid", slurm, {"HOME": "{dir}"}, {".invoke.yaml": "deploy:\n  nodes: 2\n"}, "accept"
    yield "yaml: -f with 20 aliases", ["-f", "{dir}/c.yaml", *slurm], {}, \
        {"c.yaml": "n: &n 2\nl: [" + ", ".join(["*n"] * 20) + "]\ndeploy:\n  nodes: *n\n"}, "refuse"


def klass(name: str) -> str:
    """The input class a case belongs to, for the counts."""
    for prefix, label in (("tar:", "code tar"), ("clusters.json", "held records"), ("runs.json", "held records"),
                          ("launcher", "launcher environment"), ("yaml:", "YAML config"), ("-f config", "YAML config"),
                          ("spec:", "spec"), ("images.json", "records"), ("env ", "INVOKE_* variables"),
                          ("launch", "launcher flags and scheduler variables"), ("run ", "launcher flags and scheduler variables"),
                          ("worker group", "worker-group options")):
        if name.startswith(prefix):
            return label
    return "flags"


TOOLS = ("scancel", "squeue", "srun", "sbatch", "sky", "kubectl")


def _tools(d: Path) -> Path:
    """Stand-ins for the scheduler tools: each logs its argv to d/calls.log; squeue says RUNNING,
    srun swallows its stdin and exits 5 (a held run's step that fails); the others fail."""
    bin_dir = d / ".bin"
    bin_dir.mkdir()
    log = d / "calls.log"
    for tool in TOOLS:
        body = {"squeue": 'case "$*" in *"%i %T"*) echo "42 RUNNING";; *) echo RUNNING;; esac; exit 0',
                "srun": "cat > /dev/null; exit 5"}.get(tool, "exit 1")
        (bin_dir / tool).write_text(f'#!/bin/sh\nprintf "%s\\n" "{tool} $*" >> {log}\n{body}\n')
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _held_run_record(d: Path) -> str:
    """A held Slurm cluster's record that `invoke run` from this tree accepts (its keys are this tree's)."""
    code = ("import json, sys\nfrom pathlib import Path\nfrom toolchain import project\n"
            "from toolchain.image.images import source_keys\nfrom runtime.spec import spec_hash\n"
            "s = project.settings(Path(sys.argv[1]))\nk = source_keys(s)\n"
            "print(json.dumps({'below_app_key': k['below_app_key'], 'runtime_sha256': k['runtime_sha256'], "
            "'spec_sha256': spec_hash(s.path(s.project.spec))}))\n")
    keys = json.loads(subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout)
    return json.dumps({"job": _cluster("slurm", SLURM, **keys)})



def _snapshot(d: Path) -> dict:
    """Every path under D with what it is (a small file by its bytes), to tell a write on failure."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if rel.startswith(".bin") or rel == "calls.log":
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file() and p.stat().st_size < (1 << 20):
            out[rel] = p.read_bytes()
        else:
            out[rel] = p.stat().st_mode >> 12 if p.exists() else "?"
    return out


def _write_files(d: Path, files: dict, canary: str) -> None:
    for rel, text in files.items():
        p = d / rel
        if p.parent == d / "build" / "images.json" or (p.parent.name.endswith(".json") and p.parent.is_file()):
            p.parent.unlink()  # the record is a directory in this case
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_file() or p.is_symlink():
            p.unlink()
        if text is None:
            os.mkfifo(p)
        elif isinstance(text, tuple):  # ("link", target)
            p.symlink_to(text[1].replace("{dir}", str(d)))
        elif isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text.replace("{canary}", canary))


def run_case(base: Path, canary: str, name, argv, env, files, expect, extra=None) -> str:
    extra = extra or {}
    d = Path(tempfile.mkdtemp(prefix="case-", dir=base))
    (d / "build").mkdir()
    spec_file = ROOT / "cluster_specs" / "local.json"
    (d / "build" / "images.json").write_text(images_json(spec_file))
    env = dict(env)
    if env.pop("@held-run", None):
        (d / "build" / "clusters.json").write_text(_held_run_record(d))
    # every case runs in a project (the example's code), as a user's command does; a case's own files win
    (d / "raytrain.yaml").write_text(f"project:\n  name: example\n  app_dir: {ROOT / 'examples' / 'train'}\n"
                                     f"  requirements: [{ROOT / 'examples' / 'train' / 'requirements.txt'}]\n")
    _write_files(d, files, canary)
    argv = [a.replace("{dir}", str(d)) for a in argv]
    if argv and argv[0] == "@runtime":
        cmd = [*RUNTIME, *argv[1:]]
    elif argv and argv[0] == "@python":
        cmd = [sys.executable, *argv[1:]]
    else:
        cmd = [*RAYTRAIN, *argv]
    bin_dir = _tools(d)
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_PROJECT_BUILD_DIR": str(d / "build"),
                "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(d),
                **{k: v.replace("{canary}", canary).replace("{dir}", str(d)) for k, v in env.items()}}
    if "--spec" not in argv and argv and argv[0] not in ("@runtime", "@python") and "spec.check" not in argv:
        full_env.setdefault("INVOKE_PROJECT_SPEC", str(ROOT / "cluster_specs" / ("slurm.json" if "slurm" in argv else "local.json")))
        if "slurm" in argv:
            (d / "build" / "images.json").write_text(images_json(ROOT / "cluster_specs" / "slurm.json"))
    if "k8s" in argv:
        (d / "build" / "images.json").write_text(images_json(ROOT / "cluster_specs" / "kubernetes.json"))
    before = _snapshot(d)
    try:
        r = subprocess.run(cmd, cwd=d, env=full_env, capture_output=True, timeout=TIMEOUT_S,
                           input=extra.get("stdin", b""))
    except subprocess.TimeoutExpired:
        return "hang"
    stderr = r.stderr.decode("utf-8", "replace")
    after = _snapshot(d)
    if Path(canary).exists():
        Path(canary).unlink()
        return "injection"
    if after.get("outside.txt", "mine".encode()) != b"mine":
        return "injection"
    calls = (d / "calls.log").read_text() if (d / "calls.log").exists() else ""
    if expect == "refuse" and calls and not extra.get("tools_may_run"):
        print(f"   argv that reached a tool: {calls.splitlines()[0][:120]!r}")
        return "escape"
    if "Traceback" in stderr:
        return "traceback"
    if "no raytrain project in" in stderr:  # refused for want of a project, not for the value: the probe's fault
        print(f"   {stderr.strip()[-200:]}")
        return "harness"
    if expect == "refuse" and r.returncode == 0:
        return "silent"
    if expect == "accept" and r.returncode != 0:
        print(f"   {stderr.strip()[-300:]}")
        return "over-refused"
    if r.returncode != 0 and after != before:
        changed = sorted(set(after) ^ set(before)) or [k for k in after if after[k] != before.get(k)]
        print(f"   changed: {changed[:4]}")
        return "write-on-fail"
    if expect == "refuse" and r.returncode != 2:
        return "ok" if r.returncode in (1, 2) and "error" in stderr.lower() else "silent"
    return "ok"


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="probe-"))
    canary = str(base / "CANARY")
    counts: Counter = Counter()
    by_class: dict[str, Counter] = {}
    outcomes = ("ok", "traceback", "hang", "silent", "over-refused", "injection", "escape", "write-on-fail", "harness")
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a class's name, to probe only that one
    try:
        all_cases = [c for gen in (cases, tar_cases, record_cases, launcher_env_cases, yaml_cases) for c in gen(canary)
                     if only.lower() in klass(c[0]).lower()]
        for name, argv, env, files, expect, *extra in all_cases:
            outcome = run_case(base, canary, name, argv, env, files, expect, *extra)
            counts[outcome] += 1
            by_class.setdefault(klass(name), Counter())[outcome] += 1
            if outcome != "ok":
                print(f"{outcome:14} {name}", flush=True)
        print(f"\n{len(all_cases)} cases: " + ", ".join(f"{k} {counts[k]}" for k in outcomes))
        for label, c in sorted(by_class.items()):
            print(f"  {label:40} {sum(c.values()):4} cases: " + ", ".join(f"{k} {c[k]}" for k in outcomes if c[k]))
    finally:
        subprocess.run(["rm", "-rf", str(base)])
    return 0 if counts["ok"] == sum(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Scripts written for torchrun, unchanged (runtime/workers/script_ranks.py, `--torchrun`): every node runs
NPROC ranks with torchrun's environment; a failure restarts the group up to --max-restarts; the job's
exit code is the first failing rank's. On real Ray nodes of this host, on the local target's containers,
and on the real Slurm (tests/test_deploy_slurm.py's cluster)."""
import json
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.workers import script_ranks

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "data" / "torchrun_probe.py"
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")


def contracts(output: str) -> list[dict]:
    return [json.loads(m.group(1)) for m in re.finditer(r"CONTRACT (\{.*\})", output)]


def check_contract(seen: list[dict], nodes: int, nproc: int, restart: int, max_restarts: int) -> None:
    """Every rank once, torchrun's values: world nodes x nproc, ranks by node, one master, the all-reduce."""
    world = nodes * nproc
    assert sorted(int(c["RANK"]) for c in seen) == list(range(world)), seen
    for c in seen:
        rank = int(c["RANK"])
        assert c["LOCAL_RANK"] == str(rank % nproc) and c["GROUP_RANK"] == str(rank // nproc)
        assert c["ROLE_RANK"] == c["RANK"] and c["ROLE_NAME"] == "default"
        assert (c["WORLD_SIZE"], c["ROLE_WORLD_SIZE"], c["LOCAL_WORLD_SIZE"], c["GROUP_WORLD_SIZE"]) == \
            (str(world), str(world), str(nproc), str(nodes))
        assert c["TORCHELASTIC_RESTART_COUNT"] == str(restart) and c["TORCHELASTIC_MAX_RESTARTS"] == str(max_restarts)
        assert c["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert c["OMP_NUM_THREADS"] == ("1" if nproc > 1 else c["OMP_NUM_THREADS"])
        assert c["sum"] == world * (world + 1) / 2
    assert len({(c["MASTER_ADDR"], c["MASTER_PORT"]) for c in seen}) == 1


# -- the pieces, engine-free ---------------------------------------------------------------
def test_rank_env_is_torchrun_s():
    node = script_ranks.Node(rank=2, node_id="n", ip="10.0.0.3", gpus=8)
    env = script_ranks.rank_env(node, 5, 8, 4, ("10.0.0.1", 29500), "run-1", 1, 3)
    assert env["RANK"] == "21" and env["LOCAL_RANK"] == "5" and env["GROUP_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "32" and env["LOCAL_WORLD_SIZE"] == "8"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert (env["TORCHELASTIC_RUN_ID"], env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == \
        ("run-1", "1", "3")


def test_ranks_per_node_defaults_to_the_gpus_and_refuses_more():
    cpu = [script_ranks.Node(0, "a", "x", 0), script_ranks.Node(1, "b", "y", 0)]
    gpu = [script_ranks.Node(0, "a", "x", 4), script_ranks.Node(1, "b", "y", 4)]
    assert script_ranks.ranks_per_node(cpu, None) == 1 and script_ranks.ranks_per_node(gpu, None) == 4
    assert script_ranks.ranks_per_node(cpu, 3) == 3 and script_ranks.ranks_per_node(gpu, 2) == 2
    with pytest.raises(ValueError, match="--nproc-per-node: 5 ranks per node, but a node has 4 GPU"):
        script_ranks.ranks_per_node(gpu, 5)


def test_the_rank_that_failed_first_is_the_one_whose_peers_lost_it_even_if_they_were_reaped_before_it():
    """As seen on the real Slurm under load: rank 5 exits with 3, its peer rank 3 fails on the closed
    connection and is reaped on its node before rank 5 is: the job ends with rank 5's code."""
    node = script_ranks.Node(0, "a", "x", 0)
    lost = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.3]:28004",)
    peer = script_ranks.Failure(3, node, 1, script_ranks.Ended(1, ("Traceback (most recent call last):", *lost),
                                                               False, at=100.0))
    cause = script_ranks.Failure(5, node, 1, script_ranks.Ended(3, ("rank 5 fails on purpose",), False, at=100.4))
    later = script_ranks.Failure(4, node, 0, script_ranks.Ended(2, ("ValueError: bad batch",), False, at=101.0))
    assert script_ranks.first_failure([peer, cause, later]).rank == 5
    assert script_ranks.first_failure([peer, later]).rank == 4  # a rank that failed on its own, later
    assert script_ranks.first_failure([peer]).rank == 3 and script_ranks.first_failure([]) is None
    nccl = script_ranks.Ended(1, ("torch.distributed.DistBackendError: NCCL error: remote process exited or "
                                  "there was a network error, NCCL version 2.21.5",), False, at=99.0)
    assert script_ranks.followed_a_peer(nccl) and not script_ranks.followed_a_peer(cause.ended)


@pytest.fixture
def project(tmp_path):
    """A project with the probe in its code (deploy's pre-flight, no image needed for these refusals)."""
    shutil.copy(PROBE, tmp_path / "probe.py")
    (tmp_path / "raytrain.yaml").write_text(f"project:\n  spec: {ROOT}/cluster_specs/slurm.json\n")
    return tmp_path


@pytest.mark.parametrize("args,says", [
    (["--torchrun", "nope.py"], "--torchrun: 'nope.py' is not a script in the project's code"),
    (["--torchrun", "../probe.py"], "is not a script in the project's code"),
    (["--torchrun", "--x probe.py"], "--torchrun: '--x' is an option, not a script"),
    (["--torchrun", "probe.py", "--command", "python x.py"], "--torchrun and --command: give one"),
    (["--torchrun", "probe.py", "--nproc-per-node", "0"], "--nproc-per-node: '0' is not a whole number between 1"),
    (["--torchrun", "probe.py", "--nproc-per-node", "two"], "--nproc-per-node: 'two' is not a whole number"),
    (["--torchrun", "probe.py", "--max-restarts", "-1"], "--max-restarts"),
    (["--torchrun", "probe.py", "--max-restarts", "1001"], "--max-restarts"),
    (["--nproc-per-node", "2"], "--nproc-per-node: it is a --torchrun option"),
    (["--torchrun", "probe.py", "--gpus", "1", "--nproc-per-node", "2"],
     "--nproc-per-node: 2 ranks per node, but the job asks for 1 GPU(s) a node"),
])
def test_bad_torchrun_flags_are_one_line_and_exit_2_before_anything_starts(project, args, says):
    r = subprocess.run([RAYTRAIN, "deploy", "--target", "slurm", "--dry-run", *args], cwd=project, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (project / "build" / "deploy").exists()


def test_the_job_s_command_is_the_runtime_s_torchrun(project):
    from toolchain.job_inputs import driver_command
    from toolchain.project import settings as project_settings
    s = project_settings(project)
    assert driver_command(s, None, "probe.py --fail-on 0", 2, 1) == [
        "python", "-m", "runtime", "torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "--",
        "probe.py", "--fail-on", "0"]
    assert driver_command(s, None, "-m pkg.train --x") == ["python", "-m", "runtime", "torchrun", "--", "-m",
                                                            "pkg.train", "--x"]
    # a project whose deploy.command is a torchrun one (raytrain init --torchrun): the flags go into it
    (project / "requirements.txt").write_text("")
    r = subprocess.run([RAYTRAIN, "init", "--torchrun", "probe.py --fail-on 9"], cwd=project, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "already holds raytrain settings" in r.stderr  # the fixture's raytrain.yaml
    (project / "raytrain.yaml").unlink()
    r = subprocess.run([RAYTRAIN, "init", "--torchrun", "probe.py --fail-on 9"], cwd=project, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from toolchain.project import forget
    forget()  # this process looked before: it looks again
    s = project_settings(project)
    assert s.deploy.command == ["python", "-m", "runtime", "torchrun", "--", "probe.py", "--fail-on", "9"]
    assert driver_command(s, None, None, 2, 1) == ["python", "-m", "runtime", "torchrun", "--nproc-per-node", "2",
                                                  "--max-restarts", "1", "--", "probe.py", "--fail-on", "9"]


# -- real Ray nodes on this host (the launcher, as every target starts it) -------------------------
def host_job(nodes: int, torchrun_args: list[str], script_args: list[str] = ()) -> tuple[int, str]:
    from test_launch import finish, launch
    token = secrets.token_hex(32)
    workers = [launch(r, nodes, token, RAYTRAIN_RUN_ID="host-run") for r in range(1, nodes)]
    head = launch(0, nodes, token, cmd=[sys.executable, "-m", "runtime", "torchrun", *torchrun_args, "--",
                                         str(PROBE), *script_args], RAYTRAIN_RUN_ID="host-run")
    return finish([head, *workers])[0]


@pytest.mark.cluster
def test_on_two_nodes_every_rank_has_torchrun_s_environment_and_a_failure_restarts_the_group_once():
    code, out = host_job(2, ["--nproc-per-node", "2", "--max-restarts", "1"], ["--fail-rank", "1", "--fail-on", "0"])
    assert code == 0, out[-4000:]
    seen = contracts(out)
    # attempt 0: a rank stopped on rank 1's failure may not have printed yet; attempt 1 runs to the end
    first = [c for c in seen if c["TORCHELASTIC_RESTART_COUNT"] == "0"]
    assert first and {(c["TORCHELASTIC_MAX_RESTARTS"], c["WORLD_SIZE"]) for c in first} == {("1", "4")}, out[-4000:]
    check_contract([c for c in seen if c["TORCHELASTIC_RESTART_COUNT"] == "1"], nodes=2, nproc=2, restart=1,
                   max_restarts=1)
    assert len(seen) - len(first) == 4, out[-4000:]
    assert {c["TORCHELASTIC_RUN_ID"] for c in seen} == {"host-run"}
    assert "rank 1 fails on purpose in attempt 0" in out and "rank 1 (node 0," in out
    for c in seen:  # each rank's lines carry its node and its rank
        assert re.search(rf"\(node{c['GROUP_RANK']}@\S+ pid=\d+[^)]*\) \[rank{c['RANK']}\] CONTRACT", out), out[-3000:]


@pytest.mark.cluster
def test_a_rank_that_always_fails_ends_the_job_with_its_code_naming_it():
    code, out = host_job(2, ["--nproc-per-node", "1", "--max-restarts", "1"], ["--fail-rank", "1", "--fail-on", "0,1"])
    assert code == 3, out[-4000:]
    assert re.search(r"rank 1 \(local rank 0 on node 1, \S+\) failed first, with exit code 3, after 1 restart\(s\); "
                     r"its last lines:\n(    .*\n)*    rank 1 fails on purpose in attempt 1\n", out), out[-3000:]


# -- the local target: three containers from the pushed image ---------------------------------------
@pytest.fixture(scope="module")
def probe_project(tmp_path_factory, app_dir, settings, built, registry):
    """The example's project with the probe in its code, built and pushed (only its app and spec layers are new)."""
    from conftest import SPEC, make_settings
    from toolchain import pipeline
    from toolchain.progress import Reporter
    work = tmp_path_factory.mktemp("torchrun-project")
    app = work / "app"
    shutil.copytree(app_dir, app)
    shutil.copy(PROBE, app / "probe.py")
    s = make_settings(work / "w", app, registry_address=settings.registry.address, runtime_dir=app_dir.parent / "runtime")
    s.registry.data_dir = settings.registry.data_dir
    pipeline.build(s, str(SPEC), "cpu", Reporter(quiet=True))
    pipeline.push(s, str(SPEC), "cpu", Reporter(quiet=True))
    return s


def test_on_the_local_target_three_nodes_run_two_ranks_each_and_restart_once(client, probe_project, capfd):
    import uuid

    from conftest import SPEC
    from toolchain import pipeline
    from toolchain.progress import Reporter
    name = f"trun-{uuid.uuid4().hex[:6]}"
    out = pipeline.deploy(probe_project, str(SPEC), "local", rep=Reporter(), nodes=3, name=name,
                          torchrun="probe.py --fail-rank 4 --fail-on 0", nproc_per_node=2, max_restarts=1)
    captured = capfd.readouterr()
    text = captured.out + captured.err
    assert out.applied.exit_code == 0, text[-4000:]
    assert out.job["command"][:4] == ["python", "-m", "runtime", "torchrun"]
    seen = contracts(text)
    again = [c for c in seen if c["TORCHELASTIC_RESTART_COUNT"] == "1"]
    check_contract(again, nodes=3, nproc=2, restart=1, max_restarts=1)
    assert {c["TORCHELASTIC_RUN_ID"] for c in again} == {out.job["env"]["RAYTRAIN_RUN_ID"]}
    # GROUP_RANK is the job's node: each node's ranks share a container, the head's are node 0's
    by_group = {}
    for c in again:
        by_group.setdefault(c["GROUP_RANK"], set()).add(c["node"])
    assert all(len(hosts) == 1 for hosts in by_group.values()) and len(set().union(*by_group.values())) == 3
    assert {c["cwd"] for c in again} == {"/app/project"}
    assert "rank 4 fails on purpose in attempt 0" in text and "restarting the group (1 of 1)" in text
    assert not client.containers.list(all=True, filters={"label": f"io.raytrain.job={name}"})


# -- the real Slurm: three slurmd on this host, the nodes' own environment ---------------------------
@pytest.mark.cluster
def test_on_real_slurm_three_nodes_run_the_script_and_a_failing_rank_ends_the_job_with_its_code(slurm, tmp_path):
    from deploy.targets.slurm import sbatch
    from helpers import jobs
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    shutil.copy(PROBE, code_dir / "probe.py")
    venv = Path(sys.executable).parent / "activate"
    results = {}
    for name, script_args, port in (("trun-ok", [], 27000), ("trun-fail", ["--fail-rank", "5", "--fail-on", "0"], 28000)):
        fileroot = tmp_path / name
        job = jobs.job(None, name=name, nodes=3, cpus_per_node=2, fileroot=str(fileroot), workdir=str(code_dir),
                       command=["python", "-m", "runtime", "torchrun", "--nproc-per-node", "2", "--", "probe.py",
                                *script_args], port_base=port, time_limit="10:00", env={"RAYTRAIN_RUN_ID": name})
        script = tmp_path / f"{name}.sbatch"
        script.write_text(sbatch.render(job, env_setup=[f"source {venv}"],
                                        port_stride=200))
        job_id = sbatch.submit(script, job, env=slurm.env)
        fields = slurm.wait(job_id, timeout_s=420)
        log = fileroot / "logs" / f"{name}-{job_id}.out"
        results[name] = (fields, log.read_text() if log.exists() else "")
    fields, out = results["trun-ok"]
    why = f"{fields}\n{out[-4000:]}\n{slurm.logs()}"
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", why
    seen = contracts(out)
    check_contract(seen, nodes=3, nproc=2, restart=0, max_restarts=0)
    assert {c["TORCHELASTIC_RUN_ID"] for c in seen} == {"trun-ok"}
    fields, out = results["trun-fail"]
    why = f"{fields}\n{out[-4000:]}\n{slurm.logs()}"
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "3:0", why
    assert "rank 5 (local rank 1 on node 2, " in out and "failed first, with exit code 3" in out, why

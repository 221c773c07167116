"""A real Slurm on this host for tests: munged, slurmctld and three slurmd (n1..n3, one host).

Slurm's multiple-slurmd build lets each node be `slurmd -N nK` on its own port. Everything
lives under one temporary directory; stop() kills exactly the daemons it started.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from runtime.wait import wait_until

CONF = """\
ClusterName=raytrain-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=5
# a requeued job starts again cred_expire seconds later (Slurm's default: 120)
AuthInfo=cred_expire=30
MinJobAge=600
NodeName=n[1-{n}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{node_port}-{last_port}] CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n[1-{n}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class SlurmCluster:
    def __init__(self, workdir: Path, nodes: int = 3, ctld_port: int = 16917, node_port: int = 17101):
        self.dir, self.nodes = workdir, nodes
        self.conf = workdir / "slurm.conf"
        self.ctld_port, self.node_port = ctld_port, node_port
        self.procs: list[str] = []

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60) -> "SlurmCluster":
        for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed; run scripts/setup.sh (slurm-wlm, munge)")
        self._munge()
        for sub in ("state", *[f"spool/n{k}" for k in range(1, self.nodes + 1)]):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(CONF.format(host=socket.gethostname().split(".")[0], d=self.dir, n=self.nodes,
                                         ctld_port=self.ctld_port, node_port=self.node_port,
                                         last_port=self.node_port + self.nodes - 1))
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        for k in range(1, self.nodes + 1):
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", f"n{k}"], check=True, env=self.env)
        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T %D"], capture_output=True, text=True, env=self.env).stdout
            return out.strip() == f"idle {self.nodes}"
        wait_until(idle, timeout_s=timeout_s, interval_s=0.5, what=f"{self.nodes} idle Slurm nodes", logs=self.logs)
        return self

    def _munge(self) -> None:
        if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run(["mungekey", "-c"], check=True)
            shutil.chown("/etc/munge/munge.key", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in sorted(self.dir.glob("*.log")))

    def wait(self, job_id: str, timeout_s: float) -> dict:
        """Block until the job has ended; return scontrol's fields (JobState, ExitCode, ...)."""
        def ended() -> dict:
            out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                                 env=self.env).stdout
            fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            done = fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
            return fields if done else {}
        try:
            return wait_until(ended, timeout_s=timeout_s, interval_s=1, what=f"Slurm job {job_id} to end", logs=self.logs)
        finally:
            subprocess.run(["scancel", job_id], env=self.env, capture_output=True)

    def stop(self) -> None:
        for pidfile in self.dir.glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass

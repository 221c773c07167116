"""What the Kubernetes target asks of a cluster, all through `kubectl` (the user's kubeconfig and context).

    launch(objs, ...)    create each job's token Secret (fresh value, sent on stdin) and apply the objects
    destroy(group, ...)  delete exactly what launch created, by label
    pods, logs           what a held cluster's wait and status read (deploy/targets/k8s/held.py)
    look(namespace, ...) the namespace (with its Pod Security labels) and which of the named Secrets exist;
                         None when the cluster cannot be asked (no kubectl, no kubeconfig, unreachable)
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from deploy import commands
from deploy.job import DeployError

KINDS = "jobs.batch,services,secrets"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# the labels every object of a job carries (deploy/targets/k8s/): what selectors are made of
LABEL_JOB = "raytrain.io/job"
LABEL_ROLE = "raytrain.io/role"
LABEL_SEED = "raytrain.io/seed"
LABEL_GROUP = "raytrain.io/group"  # the name given to deploy: one job, or every seed of a fan-out


def group_selector(group: str) -> str:
    return f"{LABEL_GROUP}={group}"


def head_selector(job_name: str) -> str:
    return f"{LABEL_JOB}={job_name},{LABEL_ROLE}=head"


def run(args: list[str], stdin: Optional[str] = None, kubectl: str = "kubectl", timeout_s: float = 300,
        env: Optional[dict] = None) -> str:
    res = commands.run([kubectl, *args], "install kubectl or apply the written manifests yourself", env, timeout_s,
                       stdin, slow="check the cluster and `kubectl config current-context`")
    if res.returncode != 0:
        raise DeployError(f"kubectl {' '.join(args[:2])} failed ({res.returncode}): {res.stderr.strip()[-800:]}")
    return res.stdout


def launch(secrets: list[dict], objs: list[dict], namespace: str, kubectl: str = "kubectl") -> str:
    """Apply the Secrets and the objects in one request. JSON on stdin: each token goes to the API server,
    not to a file or a command line."""
    return run(["apply", "-n", namespace, "-f", "-"],
               json.dumps({"apiVersion": "v1", "kind": "List", "items": secrets + objs}), kubectl)


def destroy(selector: str, namespace: str, kubectl: str = "kubectl", env: Optional[dict] = None) -> str:
    """Delete the Jobs (with their pods), Services and Secrets that carry the label selector."""
    return run(["delete", KINDS, "-n", namespace, "-l", selector, "--cascade=foreground", "--ignore-not-found"],
               kubectl=kubectl, env=env)


def pods(selector: str, namespace: str, env: Optional[dict] = None) -> list[dict]:
    """The pods that carry the label selector, as the API server describes them."""
    return json.loads(run(["get", "pods", "-n", namespace, "-l", selector, "-o", "json", "--request-timeout=20s"],
                          timeout_s=30, env=env)).get("items", [])


def logs(pod: str, namespace: str, container: str, env: Optional[dict] = None) -> str:
    try:
        return run(["logs", "-n", namespace, pod, "-c", container, "--request-timeout=20s"], timeout_s=30, env=env)
    except DeployError:
        return ""  # not started yet, or already gone


@dataclass(frozen=True)
class ClusterView:
    namespace_exists: bool
    enforce: Optional[str]          # the namespace's Pod Security enforce level, if labelled
    secrets: frozenset              # which of the asked-for Secret names exist in the namespace


def can_ask(kubectl: str = "kubectl", env: Optional[dict] = None) -> bool:
    """A kubectl and a kubeconfig to use: otherwise the cluster is not asked at all."""
    env = os.environ if env is None else env
    config = env.get("KUBECONFIG") or str(Path(env.get("HOME", "~")).expanduser() / ".kube" / "config")
    return shutil.which(kubectl) is not None and any(Path(p).is_file() for p in config.split(os.pathsep) if p)


def look(namespace: str, secret_names: Sequence[str], kubectl: str = "kubectl",
         ask: Callable[..., str] = run) -> ClusterView:
    """The namespace and the Secrets, in two requests; DeployError when the cluster does not answer."""
    args = ["--request-timeout=10s"]
    try:
        answer = ask(["get", "namespace", namespace, "-o", "json", *args], kubectl=kubectl, timeout_s=20)
        ns = json.loads(answer)
    except DeployError as e:
        if "NotFound" in str(e) or "not found" in str(e):
            return ClusterView(False, None, frozenset())
        raise
    except ValueError:
        ns = None
    if not isinstance(ns, dict):
        raise DeployError(f"kubectl get namespace {namespace} did not print a namespace as JSON ({answer[:100]!r})")
    labels = ns.get("metadata", {}).get("labels") or {}
    # names only: the Secrets' values never reach this process
    listed = ask(["get", "secrets", "-n", namespace, "-o", "name", *args], kubectl=kubectl, timeout_s=20)
    present = {line.partition("/")[2] for line in listed.split()} & set(secret_names)
    return ClusterView(True, labels.get(ENFORCE_LABEL), frozenset(present))

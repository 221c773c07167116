"""A held cluster on Kubernetes: the Jobs `invoke up` applied, their head pod serving drivers.

    wait_serving  after apply: the head pod's log says it serves (or it ended: its log); the objects
                  are deleted again if it never does
    run           `kubectl exec -i HEAD_POD -c ray -- env RAYTRAIN_...=... python -m runtime run
                  --unpack-stdin /tmp`, the code as a tar on stdin: unpacked once in the head pod (by its
                  hash) and handed to the head (runtime/cluster/serving.py); the driver gets the pod's own
                  environment, the token from the job's Secret included: nothing secret leaves the pods
    status        the phase of each of the job's pods
    down          the job's objects deleted by label, as `invoke destroy` does: the pods get SIGTERM,
                  the head stops serving and every node leaves with 0
"""
from __future__ import annotations

from typing import Callable, Optional

from deploy import held_step
from deploy.handles import ClusterStatus, K8sHandle
from deploy.targets.k8s import kubectl
from deploy.job import DeployError, JobSpec
from runtime.contract import is_serving
from runtime.wait import wait_until
from deploy import hint

CONTAINER = "ray"  # the pods' one container (deploy/targets/k8s/)


def _why_waiting(pod: dict) -> str:
    """Pending's reason, as `kubectl get pods` shows it (ContainerCreating, ErrImagePull, ...)."""
    for st in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (st.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', '')}: {waiting.get('message', '')}"[:300].rstrip(": ")
    return pod.get("status", {}).get("phase", "?")


def _head(job: JobSpec, namespace: str, env: Optional[dict]) -> tuple[Optional[str], str]:
    """(the head pod if it serves, else None; what the wait is for). DeployError if the head pod ended."""
    try:
        heads = kubectl.pods(kubectl.head_selector(job.name), namespace, env)
    except DeployError as e:  # the API server did not answer this once: asked again on the next poll
        return None, f"the API server did not answer: {str(e)[:200]}"
    running = [p["metadata"]["name"] for p in heads if p.get("status", {}).get("phase") == "Running"]
    if running:
        serves = is_serving(kubectl.logs(running[-1], namespace, CONTAINER, env))
        return (running[-1] if serves else None), f"pod {running[-1]}: running, forming the cluster"
    if heads and all(p.get("status", {}).get("phase") in ("Succeeded", "Failed") for p in heads):
        pod = heads[-1]["metadata"]["name"]
        tail = "\n    ".join(kubectl.logs(pod, namespace, CONTAINER, env).splitlines()[-15:])
        raise DeployError(f"the head pod {pod} ended before it served:\n    {tail}")
    return None, f"pod {heads[-1]['metadata']['name']}: {_why_waiting(heads[-1])}" if heads else "no head pod yet"


def wait_serving(job: JobSpec, namespace: str, progress: Callable[[str], None], env: Optional[dict] = None,
                 timeout_s: float = 1800) -> K8sHandle:
    """The handle once the head pod serves. A head pod that ends first, or the timeout (the first pull
    of a 7 GB image takes minutes), deletes what was applied and says why."""
    said = {"state": ""}

    def serving() -> Optional[str]:
        pod, state = _head(job, namespace, env)
        if not pod and state != said["state"]:
            progress(f"k8s: waiting for the head to serve ({state})")
            said["state"] = state
        return pod
    try:
        pod = wait_until(serving, timeout_s=timeout_s, interval_s=1, what=f"the head of {job.name} to serve",
                         on_timeout=lambda: DeployError(
                             f"the head of {job.name} did not serve within {timeout_s:.0f} s ({said['state']}); "
                             f"see `kubectl describe pods -l {kubectl.head_selector(job.name)}`"))
    except BaseException:
        try:
            kubectl.destroy(kubectl.group_selector(job.name), namespace, env=env)
        except DeployError as e:
            progress(f"k8s: could not delete what up applied ({e}); `{hint.cmd('destroy --target k8s --name ' + job.name)}` does")
        raise
    return K8sHandle(namespace=namespace, job_name=job.name, head_pod=pod)


def status(handle: K8sHandle, env: Optional[dict] = None) -> ClusterStatus:
    pods = kubectl.pods(kubectl.group_selector(handle.job_name), handle.namespace, env)
    phases = {p["metadata"]["name"]: p.get("status", {}).get("phase", "?") for p in pods}
    return ClusterStatus(phases.get(handle.head_pod) == "Running", phases or {handle.job_name: "gone"})


def run_step(handle: K8sHandle, rel_dir: str, argv: list[str], run_env: dict) -> list[str]:
    """`kubectl exec` of ARGV in the head pod, its code coming on stdin; RUN_ENV through `env` (exec has
    no environment flag), the pod's own environment otherwise."""
    return ["kubectl", "exec", "-i", "-n", handle.namespace, handle.head_pod, "-c", CONTAINER, "--",
            "env", *(f"{k}={v}" for k, v in sorted(run_env.items())), *held_step.runtime_run(rel_dir, argv)]


def run(handle: K8sHandle, env: Optional[dict], code_tar: bytes, rel_dir: str, argv: list[str], run_env: dict,
        out=None) -> int:
    return held_step.stream(run_step(handle, rel_dir, argv, run_env), env, code_tar, out,
                            "install kubectl and point KUBECONFIG at the cluster")


def down(handle: K8sHandle, env: Optional[dict] = None) -> list[str]:
    """Delete the job's objects by label (`invoke destroy`'s request); the pods that were there."""
    selector = kubectl.group_selector(handle.job_name)
    pods = [p["metadata"]["name"] for p in kubectl.pods(selector, handle.namespace, env)]
    kubectl.destroy(selector, handle.namespace, env=env)
    return pods

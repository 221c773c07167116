"""The Kubernetes target: manifests as data (serialised with yaml.safe_dump), then apply/delete.

Per job (all objects labelled raytrain.io/job=<name>, so `destroy` deletes exactly them):
  Service  <name>-head     headless, selects the head pod; its DNS name is the head address
                           (publishNotReadyAddresses: workers may resolve it before readiness).
  Job      <name>-head     one pod: `runtime launch -- <command>`, explicit RAYTRAIN_NODE_RANK=0;
                           its exit code is the driver's.
  Job      <name>-workers  an Indexed Job of nodes-1 pods: rank = JOB_COMPLETION_INDEX + 1.
  Secret   <name>-ray-token  created by `--submit` with a fresh token; the files on disk hold only
                           the reference (secretKeyRef), never the value. Without --submit, pre-flight
                           asks the cluster (when kubectl can) and refuses to write files whose Secret
                           or namespace is missing, giving the command that creates it.
Indexed Jobs rather than StatefulSets: a training run ends, and a Job records how it ended.
Every pod: image by digest, /dev/shm as an in-memory emptyDir, fileroot from the spec's PVC,
nodeSelector, nvidia.com/gpu limits, an ephemeral-storage request, a TCP readiness probe on the
node's Ray port (GCS on the head, raylet on workers), the node's name from the downward API
(RAYTRAIN_NODE_NAME: node type and GPU type are matched against it), activeDeadlineSeconds from the
time limit, and Pod Security `restricted`: non-root as the image's numeric uid/gid, all capabilities
dropped, no privilege escalation, seccomp RuntimeDefault. The spec's other mounts become hostPath
volumes only with `kubernetes.pod_security: privileged` (restricted and baseline refuse hostPath).
Failures: a disruption (eviction, preemption, node drain) does not count against backoffLimit, a worker
that lost the head (exit 3) is started again to rejoin, exit 2 (the node cannot start: configuration)
fails the Job at once; anything else is retried within backoffLimit (a lost worker pod is replaced and
rejoins the running group).

Multi-seed fan-out (`render_seeds`): one independent job per seed, named <name>-s<seed>,
optionally pinned to (node, GPU) slots as in the seed's ReplicaSet recipe (nodeSelector on
kubernetes.io/hostname and NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES instead of a GPU limit).
"""
from __future__ import annotations

import os
import re
from collections import Counter
import secrets as _secrets
from dataclasses import dataclass
from typing import Annotated, Optional, Sequence

import yaml
from pydantic import Field

from deploy.targets.k8s import held
from deploy.targets.k8s import kubectl
from deploy.targets.k8s.kubectl import LABEL_GROUP, LABEL_JOB, LABEL_ROLE, LABEL_SEED
from deploy.job import JOB_NAME_RE, DeployError, JobSpec, time_limit_seconds
from deploy.targets.base import (AllowLocalRegistry, Applied, ApplyContext, Artifacts, Destroyed, File,
                                 SiteCheck, Target, TargetOptions)
from deploy.targets.seeds import MAX_SEEDS, Seeds, from_text, seeds_problems
from deploy.yaml_out import Dumper
from runtime import contract as C
from runtime import k8s_names
from runtime.contract import EXIT_HEAD_LOST, EXIT_NODE_CANNOT_START
from runtime.contract import RayPorts
from runtime.spec import ClusterSpec, KubernetesOptions
from runtime.errors import RaytrainError
from deploy import hint
from deploy.handles import K8sHandle

TOKEN_KEY = "token"


@dataclass(frozen=True)
class Slot:
    """Where one seed runs: a node (kubernetes.io/hostname) and optionally one GPU index on it."""
    node: str
    gpu: Optional[int] = None

    @classmethod
    def parse(cls, text: str) -> "Slot":
        """NODE[:GPU]: NODE a DNS-1123 subdomain (kubernetes.io/hostname), GPU an index 0-63."""
        m = re.fullmatch(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)(?::([0-9]{1,2}))?", text.strip())
        if not m or (m.group(3) is not None and int(m.group(3)) > 63):
            raise DeployError(f"--slots: {text[:80]!r} is not NODE or NODE:GPU_INDEX (e.g. phortx1:0)")
        return cls(m.group(1), int(m.group(3)) if m.group(3) is not None else None)


def names(job: JobSpec) -> dict:
    return {"service": f"{job.name}-head", "head": f"{job.name}-head", "workers": f"{job.name}-workers",
            "secret": f"{job.name}-ray-token"}


def _quantity(size: str) -> str:
    """docker-style '2g' -> Kubernetes '2Gi'."""
    m = re.fullmatch(r"([0-9]+)([kmgKMG]?)", size)
    if not m:
        raise DeployError(f"shm size {size!r} is not a number with an optional k/m/g suffix")
    return m.group(1) + {"": "", "k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2).lower()]


def _env(job: JobSpec, extra: dict) -> list[dict]:
    n = names(job)
    env = [{"name": k, "value": v} for k, v in sorted({**job.env, **extra}.items())]
    env.append({"name": C.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    env.append({"name": C.AUTH_TOKEN, "valueFrom": {"secretKeyRef": {"name": n["secret"], "key": TOKEN_KEY}}})
    return env


def host_mounts(job: JobSpec, opts: KubernetesOptions) -> list:
    """The spec's mounts that would be hostPath volumes (the fileroot claim provides its own)."""
    return [m for m in job.mounts if not (opts.fileroot_claim and m.target == job.fileroot)]


def _volumes(job: JobSpec, opts: KubernetesOptions) -> tuple[list, list]:
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(job.shm_size)}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if opts.fileroot_claim:
        volumes.append({"name": "fileroot", "persistentVolumeClaim": {"claimName": opts.fileroot_claim}})
        mounts.append({"name": "fileroot", "mountPath": job.fileroot})
    hosted = host_mounts(job, opts)
    if hosted and opts.pod_security != "privileged":
        raise DeployError(hostpath_problem(hosted[0], opts))
    for i, m in enumerate(hosted):
        volumes.append({"name": f"mount-{i}", "hostPath": {"path": m.source, "type": "Directory"}})
        mounts.append({"name": f"mount-{i}", "mountPath": m.target, "readOnly": "ro" in (m.options or "").split(",")})
    return volumes, mounts


def hostpath_problem(mount, opts: KubernetesOptions) -> str:
    return (f"mount {mount.as_string()!r}: a hostPath volume, which Pod Security 'restricted' (and 'baseline') "
            f"refuses; put the data on the fileroot claim (kubernetes.fileroot_claim), drop the mount from "
            f"default_mount, or set kubernetes.pod_security to 'privileged' if namespace {opts.namespace} allows it")


def _pod(job: JobSpec, opts: KubernetesOptions, role: str, labels: dict, args: list[str], env_extra: dict,
         slot: Optional[Slot]) -> dict:
    job.image.require_pinned()
    ports = RayPorts(job.port_base, ephemeral_low=C.PORTABLE_EPHEMERAL_LOW)
    volumes, mounts = _volumes(job, opts)
    resources: dict = {"requests": {"cpu": str(job.cpus_per_node), "ephemeral-storage": opts.ephemeral_storage}}
    if job.memory:
        resources["requests"]["memory"] = job.memory + ("i" if job.memory[-1] in "KMGT" else "")
    gpus = job.gpus_per_node
    if slot and slot.gpu is not None:
        env_extra = {**env_extra, "NVIDIA_VISIBLE_DEVICES": str(slot.gpu), "CUDA_VISIBLE_DEVICES": str(slot.gpu)}
    elif gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    probe_port = ports.gcs if role == "head" else ports.node_manager
    container = {
        "name": "ray", "image": job.image.docker(), "command": list(C.RUNTIME_CMD), "args": args,
        "env": _env(job, env_extra), "resources": resources, "volumeMounts": mounts,
        "ports": [{"name": "gcs" if role == "head" else "raylet", "containerPort": probe_port}],
        "readinessProbe": {"tcpSocket": {"port": probe_port}, "periodSeconds": 5, "failureThreshold": 3},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if job.workdir:
        container["workingDir"] = job.workdir
    spec: dict = {"restartPolicy": "Never", "containers": [container], "volumes": volumes,
                  "securityContext": pod_security(job), "enableServiceLinks": False}
    selector = dict(opts.node_selector)
    if slot:
        selector["kubernetes.io/hostname"] = slot.node
    if selector:
        spec["nodeSelector"] = selector
    if opts.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": opts.image_pull_secret}]
    return {"metadata": {"labels": labels}, "spec": spec}


def pod_security(job: JobSpec) -> dict:
    """runAsNonRoot with the image's numeric uid/gid spelled out, so a kubelet can verify it whatever the
    image's USER says; fsGroup makes the fileroot volume group-writable for that gid; seccomp
    RuntimeDefault, which Pod Security 'restricted' requires."""
    uid, gid = job.uid_gid
    if uid is None or uid == 0:
        raise DeployError(f"image {job.image}: no non-root numeric uid known (got {uid!r}); the pods could not "
                          "run as non-root. Build and push again (the image's USER is recorded at push)")
    gid = gid if gid is not None else uid
    for value, what in ((uid, "the image's uid (runAsUser)"), (gid, "the image's gid (runAsGroup, fsGroup)")):
        problem = k8s_names.id_in_range(value, what)
        if problem:
            raise DeployError(f"image {job.image}: {problem}; build the image with a USER in that range")
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid, "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def failure_policy(role: str) -> dict:
    """podFailurePolicy (batch/v1, on by default since Kubernetes 1.26): disruptions are not failures, a
    node that cannot start (2) fails the Job, a worker that lost the head (3) is replaced without counting;
    any other code (4: the worker's own Ray died) counts against backoffLimit."""
    rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
             {"action": "FailJob", "onExitCodes": {"containerName": "ray", "operator": "In",
                                                    "values": [EXIT_NODE_CANNOT_START]}}]
    if role == "worker":
        rules.insert(1, {"action": "Ignore", "onExitCodes": {"containerName": "ray", "operator": "In",
                                                             "values": [EXIT_HEAD_LOST]}})
    return {"rules": rules}


def _meta(name: str, namespace: str, labels: dict) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels}


def render(job: JobSpec, opts: KubernetesOptions, *, seed: Optional[int] = None, slot: Optional[Slot] = None,
           group: Optional[str] = None) -> list[dict]:
    """The job's objects as plain dicts (Secret excluded: `launch` creates it with the token)."""
    n = names(job)
    base = {"app.kubernetes.io/name": "raytrain", "app.kubernetes.io/instance": job.name, LABEL_JOB: job.name,
            LABEL_GROUP: group or job.name}
    if seed is not None:
        base[LABEL_SEED] = str(seed)
    head_labels = {**base, LABEL_ROLE: "head"}
    worker_labels = {**base, LABEL_ROLE: "worker"}
    common = {C.NUM_NODES: str(job.nodes), C.HEAD_ADDRESS: n["service"], C.JOB_NAME: job.name}
    if seed is not None:
        common[C.SEED] = str(seed)
    launch = job.launch_argv()[len(C.RUNTIME_CMD):]  # the container's args; RUNTIME_CMD is its command
    deadline = time_limit_seconds(job.time_limit)  # the job's time limit, as Slurm's --time is
    if deadline < 1:
        raise DeployError(deadline_problem(job))
    objs = [{
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(n["service"], opts.namespace, head_labels),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": head_labels,
                 "ports": [{"name": "gcs", "port": job.port_base, "targetPort": job.port_base}]},
    }, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(n["head"], opts.namespace, head_labels),
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": job.retries, "activeDeadlineSeconds": deadline,
                 "podFailurePolicy": failure_policy("head"),
                 "template": _pod(job, opts, "head", head_labels, job.launch_argv(driver=True)[len(C.RUNTIME_CMD):],
                                  {**common, C.NODE_RANK: "0"}, slot)},
    }]
    if job.nodes > 1:
        objs.append({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(n["workers"], opts.namespace, worker_labels),
            "spec": {"completionMode": "Indexed", "completions": job.nodes - 1, "parallelism": job.nodes - 1,
                     # each worker pod may be lost once (and once per retry) and be replaced
                     "backoffLimit": (job.retries + 1) * (job.nodes - 1), "activeDeadlineSeconds": deadline,
                     "podFailurePolicy": failure_policy("worker"),
                     "template": _pod(job, opts, "worker", worker_labels, launch,
                                      {**common, C.NODE_RANK_OFFSET: "1"}, slot)},
        })
    return objs


def render_seeds(job: JobSpec, opts: KubernetesOptions, seeds: Sequence[int], slots: Sequence[Slot] = ()) -> list[dict]:
    """One independent run per seed (command gets --seed N), round-robin over the slots."""
    if len(set(seeds)) != len(seeds):
        raise DeployError(f"--seeds: repeated seed in {list(seeds)}; each run needs its own")
    objs = []
    for i, seed in enumerate(seeds):
        run = job.model_copy(update={"name": f"{job.name}-s{seed}", "command": [*job.command, "--seed", str(seed)]})
        if len(run.name) > 47:  # "<name>-workers" must stay a DNS-1035 label (<= 63)
            raise DeployError(f"job name {run.name!r} is too long for Kubernetes objects; use a shorter --name")
        objs += render(run, opts, seed=seed, slot=slots[i % len(slots)] if slots else None, group=job.name)
    return objs


def secret(job_name: str, namespace: str, token: str, labels: dict) -> dict:
    labels = {k: v for k, v in labels.items() if k != LABEL_ROLE}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(f"{job_name}-ray-token", namespace, labels), "stringData": {TOKEN_KEY: token}}


def dump(objs: list[dict]) -> str:
    """Serialise with the safe dumper: every value is data, quoted as YAML needs, never a template."""
    return yaml.dump_all(objs, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def job_names(objs: list[dict]) -> list[str]:
    return sorted({o["metadata"]["labels"][LABEL_JOB] for o in objs})


def secrets_for(objs: list[dict], namespace: str, token_factory) -> list[dict]:
    """One Secret per job, each with a fresh token (never written to disk)."""
    return [secret(name, namespace, token_factory(), _labels_of(objs, name)) for name in job_names(objs)]


def launch(objs: list[dict], namespace: str, token_factory, kubectl_bin: str = "kubectl") -> tuple[str, list[str]]:
    """Create each job's token Secret, then apply the objects: kubectl's answer, and every object sent
    as kind/name (the Secrets first; never their values)."""
    secrets = secrets_for(objs, namespace, token_factory)
    answer = kubectl.launch(secrets, objs, namespace, kubectl_bin)
    return answer, [f"{o['kind']}/{o['metadata']['name']}" for o in secrets + objs]


def destroy(group: str, namespace: str, kubectl_bin: str = "kubectl", env: Optional[dict] = None) -> str:
    """Delete exactly what launch created, by label: the Jobs (with their pods), Services and Secrets
    of the job, or of every seed run when GROUP is a fan-out's name."""
    return kubectl.destroy(kubectl.group_selector(group), namespace, kubectl_bin, env=env)


def _labels_of(objs: list[dict], name: str) -> dict:
    return next(o["metadata"]["labels"] for o in objs if o["metadata"]["labels"][LABEL_JOB] == name)


def create_secret_command(secret_name: str, namespace: str, group: str) -> str:
    """What a user runs to make a job's Secret by hand (names are DNS labels: nothing to quote)."""
    return (f"kubectl -n {namespace} create secret generic {secret_name} "
            f"--from-literal={TOKEN_KEY}=\"$(openssl rand -hex 32)\" && "
            f"kubectl -n {namespace} label secret {secret_name} {LABEL_GROUP}={group}")


def pull_secret_command(secret_name: str, namespace: str, env: Optional[dict] = None) -> str:
    """What a user runs to make the image pull Secret from their `docker login` (the README's command; the
    one place its text is made): docker keeps config.json in $DOCKER_CONFIG when that is set."""
    env = os.environ if env is None else env
    config = "$DOCKER_CONFIG/config.json" if env.get("DOCKER_CONFIG") else "$HOME/.docker/config.json"
    return f'kubectl -n {namespace} create secret docker-registry {secret_name} --from-file=.dockerconfigjson="{config}"'


def deadline_problem(job: JobSpec) -> str:
    return (f"deploy.time_limit {job.time_limit!r}: Kubernetes needs a positive activeDeadlineSeconds (Slurm reads 0 as "
            "'no limit'; a Job cannot); give a time limit such as 1-00:00:00")


def spec_problems(job: JobSpec, opts: KubernetesOptions) -> list[str]:
    """What a kube-apiserver would refuse in the rendered objects, found before rendering."""
    problems = []
    targets = [job.fileroot] if opts.fileroot_claim else []
    hosted = host_mounts(job, opts)
    targets += ["/dev/shm"] + [m.target for m in hosted]
    seen = set()
    for t in targets:
        if t.rstrip("/") in seen:
            problems.append(f"mounts: two volumes mount at {t!r}; a container's mountPath must be unique. "
                            "Remove one from default_mount (the fileroot claim and /dev/shm are mounted already)")
        seen.add(t.rstrip("/"))
    if hosted and opts.pod_security != "privileged":
        problems.append(hostpath_problem(hosted[0], opts))
    if time_limit_seconds(job.time_limit) < 1:
        problems.append(deadline_problem(job))
    uid, gid = job.uid_gid
    for value, what in ((uid, "the image's uid"), (gid, "the image's gid")):
        problem = value is not None and k8s_names.id_in_range(value, what)
        if problem:
            problems.append(f"image: {problem}; build the image with a USER in that range")
    return problems


def cluster_problems(view: kubectl.ClusterView, objs_secrets: list[str], group: str, opts: KubernetesOptions,
                     submit: bool, hosted: bool) -> list[str]:
    """What the cluster says about the namespace and the Secrets the files reference."""
    ns = opts.namespace
    if not view.namespace_exists:
        return [f"kubernetes.namespace: namespace {ns!r} does not exist in the current kubectl context; "
                f"create it (kubectl create namespace {ns}) or name an existing one in the spec"]
    problems = []
    if hosted and view.enforce in ("restricted", "baseline"):
        problems.append(f"kubernetes.pod_security: namespace {ns} enforces Pod Security {view.enforce!r}, which "
                        "refuses the hostPath volumes the spec's mounts need; use the fileroot claim instead")
    if opts.image_pull_secret and opts.image_pull_secret not in view.secrets:
        problems.append(f"kubernetes.image_pull_secret: Secret {opts.image_pull_secret!r} is not in namespace {ns}; "
                        f"create it from your docker login: {pull_secret_command(opts.image_pull_secret, ns)}")
    missing = [n for n in objs_secrets if n not in view.secrets]
    if missing and not submit:
        more = f" (and {len(missing) - 1} more, one per run)" if len(missing) > 1 else ""
        problems.append(f"the files reference Secret {missing[0]!r}{more}, which is not in namespace {ns}: `kubectl "
                        f"apply` of them would leave every pod waiting. Use --submit (it creates the Secret with a "
                        f"fresh token), or create it first: {create_secret_command(missing[0], ns, group)}")
    return problems


def parse_slots(text: str) -> list[Slot]:
    """'node1:0,node1:1 node2' -> slots (comma- or space-separated NODE[:GPU])."""
    return [Slot.parse(x) for x in text.replace(",", " ").split()]


# the options k8s shares with skypilot: deploy/targets/seeds.py; --slots is k8s' own
Slots = Annotated[list[Slot], from_text(parse_slots), Field(default_factory=list, max_length=MAX_SEEDS, description=(
    "with --seeds, NODE[:GPU] slots the runs are pinned to round-robin, e.g. 'node1:0,node1:1,node2'."))]


class K8sFlags(TargetOptions):
    """k8s' options; each description is its flag's help."""
    seeds: Seeds
    slots: Slots
    allow_local_registry: AllowLocalRegistry


class Kubernetes(Target):
    name = "k8s"
    summary = "Kubernetes manifests: head Service + Job, Indexed worker Job; --seeds fan-out; --submit applies"
    Options = K8sFlags
    pulls_image = True

    def allows_local_registry(self, opts: K8sFlags) -> bool:
        return opts.allow_local_registry

    def spec_gpus(self, spec: ClusterSpec) -> int:
        return spec.kubernetes.gpus_per_pod if spec.kubernetes else 0

    def preflight(self, job: JobSpec, spec: ClusterSpec, opts: K8sFlags) -> list[str]:
        problems = []
        k = spec.kubernetes
        if k is None:
            problems.append("kubernetes.namespace: the cluster spec has no 'kubernetes' section; add one with a namespace")
        elif k.gpus_per_pod and job.gpus_per_node != k.gpus_per_pod:
            problems.append(f"--gpus: the job asks for {job.gpus_per_node} GPUs per node, the spec's "
                            f"kubernetes.gpus_per_pod is {k.gpus_per_pod}; make them agree")
        for s in opts.slots:
            if s.gpu is not None and job.gpus_per_node > 1:
                problems.append(f"--slots {s.node}:{s.gpu}: a GPU slot gives one GPU but the job asks for "
                                f"{job.gpus_per_node} per node")
        if opts.slots and not opts.seeds:
            problems.append("--slots: only with --seeds (the fan-out pins its runs to them)")
        uid, _ = job.uid_gid
        if job.image and uid is None:
            problems.append(f"image: {job.image} has no numeric USER recorded (build/images.json 'user': "
                            f"{job.image_info.user if job.image_info else None!r}); a kubelet cannot verify "
                            "runAsNonRoot. Build and push again")
        problems += seeds_problems(job, opts.seeds)
        if k is not None:
            problems += spec_problems(job, k)
        return problems

    def site_check(self, job: JobSpec, spec: ClusterSpec, opts: K8sFlags) -> SiteCheck:
        """The namespace and the Secrets, from the cluster kubectl points at. Without a kubeconfig (or an
        answer) only --submit is refused; files are still written, with a note saying what must exist."""
        k = spec.kubernetes
        runs = [f"{job.name}-s{s}" for s in opts.seeds] if opts.seeds else [job.name]
        secret_names = [names(job.model_copy(update={"name": r}))["secret"] for r in runs]
        try:
            if not kubectl.can_ask():
                raise DeployError("no kubectl with a kubeconfig (KUBECONFIG or ~/.kube/config) here")
            view = kubectl.look(k.namespace, [*secret_names, *filter(None, [k.image_pull_secret])])
        except DeployError as e:
            if opts.submit:
                return SiteCheck(problems=[f"--submit: cannot ask the cluster: {e}"])
            return SiteCheck(notes=[
                f"the cluster was not asked ({str(e)[:300]}): before `kubectl apply -f`, namespace {k.namespace} and "
                f"Secret {secret_names[0]!r} must exist; create the Secret with: "
                f"{create_secret_command(secret_names[0], k.namespace, job.name)}"])
        return SiteCheck(problems=cluster_problems(view, secret_names, job.name, k, opts.submit,
                                                   bool(host_mounts(job, k))))

    def render(self, job: JobSpec, spec: ClusterSpec, opts: K8sFlags) -> Artifacts:
        objs = (render_seeds(job, spec.kubernetes, opts.seeds, opts.slots) if opts.seeds
                else render(job, spec.kubernetes))
        return Artifacts({f"{job.name}.yaml": File(dump(objs))}, objs)

    def apply(self, artifacts: Artifacts, job, spec: ClusterSpec, opts: K8sFlags, ctx: ApplyContext) -> Applied:
        out = super().apply(artifacts, job, spec, opts, ctx)
        if opts.submit:
            namespace = spec.kubernetes.namespace
            out.kubectl, applied = launch(artifacts.objects, namespace, lambda: _secrets.token_hex(32))
            remove = hint.cmd("down") if job.serve else hint.cmd("destroy --target k8s")  # a held cluster is ended as one
            kinds = Counter(a.partition("/")[0] for a in applied)
            ctx.progress(f"applied {len(applied)} object(s) ({', '.join(f'{n} {k}' for k, n in kinds.items())}); "
                         f"remove them with `{remove} --name {job.name}`")
            if job.serve:
                out.held = held.wait_serving(job, namespace, ctx.progress, ctx.env)
        return out

    def destroy(self, spec: ClusterSpec, name: str, launched: list[str]) -> Destroyed:
        """The job's (or a fan-out's) Jobs, pods, Services and Secrets, by label."""
        if spec.kubernetes is None:
            raise DeployError("the cluster spec has no 'kubernetes' section: nothing to destroy")
        if not re.fullmatch(JOB_NAME_RE, name):
            raise DeployError(f"--name {name[:60]!r}: not a job name (a DNS-1035 label: lowercase letter, then "
                              "letters, digits, '-')")
        namespace = spec.kubernetes.namespace
        try:
            out = destroy(name, namespace)
        except DeployError as e:  # kubectl ran and failed: not the user's input (exit 1)
            raise RaytrainError(str(e)) from None
        return Destroyed(name, f"deleted objects labelled {LABEL_GROUP}={name} in {namespace}",
                         details={"namespace": namespace, "kubectl": out})

    # a held cluster is the job's head and worker pods, the head serving (deploy/targets/k8s/held.py)
    handle = K8sHandle
    held = held


TARGET = Kubernetes()

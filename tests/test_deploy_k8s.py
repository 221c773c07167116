"""Kubernetes manifests: strict schema validation, hostile values, seed fan-out, launch/destroy,
and the exact container specs run as Docker containers until the job finishes."""
import json
import os
import stat
import time
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from deploy.handles import K8sHandle
from deploy.job import DeployError
from deploy.targets import k8s
from deploy.targets.base import ApplyContext
from helpers import jobs, k8s_docker, pod_security
from runtime.spec import KubernetesOptions, load_spec

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.32.0"
DIGEST = "registry.example.com:5000/raytrain-gpu@sha256:" + "cd" * 32


def spec_job(**kw):
    spec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    base = dict(name="train", nodes=3, gpus_per_node=1, cpus_per_node=8, memory="64G",
                command=["python", "train.py"], env={"NCCL_DEBUG": "WARN"}, mounts=spec.mounts, fileroot=spec.fileroot,
                time_limit="1-02:03:04")
    return jobs.job(DIGEST, **{**base, **kw}), spec.kubernetes


def validate_all(objs):
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_manifests_validate_in_strict_mode():
    job, opts = spec_job()
    objs = k8s.render(job, opts)
    assert [o["kind"] for o in objs] == ["Service", "Job", "Job"]
    validate_all(objs + [k8s.secret("train", opts.namespace, "t" * 64, objs[0]["metadata"]["labels"])])
    svc, head, workers = objs
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"][k8s.LABEL_ROLE] == "head"
    pod = workers["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == DIGEST and c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "fileroot", "persistentVolumeClaim": {"claimName": "shared-fileroot"}} in pod["volumes"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert workers["spec"]["completionMode"] == "Indexed" and workers["spec"]["completions"] == 2
    token_env = next(e for e in c["env"] if e["name"] == "RAY_AUTH_TOKEN")
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": "train-ray-token", "key": "token"}
    assert c["readinessProbe"]["tcpSocket"]["port"] == 20001
    assert head["spec"]["template"]["spec"]["containers"][0]["args"][-3:] == ["--", "python", "train.py"]
    for o in objs:
        assert o["metadata"]["labels"][k8s.LABEL_GROUP] == "train"


def test_a_held_cluster_serves_from_every_pod_and_runs_exec_into_the_head():
    """`invoke up --target k8s`: the same objects, every pod `launch --serve` and no driver; `invoke run`
    is a `kubectl exec -i` into the head pod with the code on stdin and only RAYTRAIN_* values given."""
    from deploy.targets.k8s import held as k8s_held
    job, opts = spec_job(serve=True)
    objs = k8s.render(job, opts)
    validate_all(objs)
    _, head, workers = objs
    head_args = head["spec"]["template"]["spec"]["containers"][0]["args"]
    worker_args = workers["spec"]["template"]["spec"]["containers"][0]["args"]
    assert head_args[-1] == "--serve" and worker_args[-1] == "--serve" and "--" not in head_args
    assert "train.py" not in json.dumps(objs)  # the driver comes with each run
    flags = k8s.TARGET.parse_options({"seeds": "1-2"})
    assert any("--seeds: a held cluster" in p for p in k8s.TARGET.preflight(job, load_spec(
        ROOT / "cluster_specs" / "kubernetes.json"), flags))
    handle = K8sHandle(namespace="ml", job_name="train", head_pod="train-head-x7")
    step = k8s_held.run_step(handle, "raytrain-code/abc", ["python", "train.py"], {"RAYTRAIN_RUN_ID": "r1"})
    assert step[:step.index("--") + 1] == ["kubectl", "exec", "-i", "-n", "ml", "train-head-x7", "-c", "ray", "--"]
    after = step[step.index("--") + 1:]
    assert after[:2] == ["env", "RAYTRAIN_RUN_ID=r1"]
    assert after[after.index("run"):] == ["run", "--code-dir", "/tmp/raytrain-code/abc", "--unpack-stdin", "/tmp",
                                          "--", "python", "train.py"]


def test_pods_pass_the_kubelets_non_root_check_and_the_yaml_has_no_aliases():
    job, opts = spec_job()
    objs = k8s.render(job, opts)
    for o in objs[1:]:
        pod = o["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                          "seccompProfile": {"type": "RuntimeDefault"}}
        assert o["spec"]["activeDeadlineSeconds"] == 86400 + 2 * 3600 + 3 * 60 + 4
        # what a kubelet checks, whatever the image's USER says (even a name)
        for image_user in ("1000:1000", "ray", ""):
            k8s_docker.verify_run_as_non_root(pod, pod["containers"][0], image_user)
    text = k8s.dump(objs)
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == objs
    # the old rendering (runAsNonRoot alone) over an image whose USER is a name: refused, as a kubelet does
    old = {**objs[1]["spec"]["template"]["spec"], "securityContext": {"runAsNonRoot": True}}  # noqa
    with pytest.raises(k8s_docker.KubeletRefused, match="non-numeric user \\(ray\\)"):
        k8s_docker.verify_run_as_non_root(old, old["containers"][0], "ray")
    with pytest.raises(DeployError, match="no non-root numeric uid"):
        k8s.render(job.model_copy(update={"image_info": jobs.info(DIGEST, user="ray")}), opts)


def test_a_broken_manifest_fails_validation():
    """The validator is not a rubber stamp: a typo'd field is refused in strict mode."""
    job, opts = spec_job()
    obj = k8s.render(job, opts)[1]
    obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


HOSTILE = ["; rm -rf /", "$(touch /tmp/pwned)", "`id`", "it's \"quoted\"", "line1\nline2", ": {", "*alias",
           "&anchor", "- item", "# comment", "yes", "0x10", "null", "~", "{{ x }}", "'"]


def test_hostile_values_survive_yaml_verbatim():
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    job, opts = spec_job(env=env, command=["python", "-c", *HOSTILE],
                         mounts=[{"source": "/data/: {x}", "target": "/mnt/*a &b"}])
    opts = opts.model_copy(update={"pod_security": "privileged"})  # hostPath volumes
    objs = k8s.render(job, opts)
    text = k8s.dump(objs)
    parsed = list(yaml.safe_load_all(text))
    assert parsed == objs
    validate_all(parsed)
    c = parsed[1]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in c["env"]}.items() >= env.items()
    assert c["args"][-len(HOSTILE):] == HOSTILE
    assert "/mnt/*a &b" in [m["mountPath"] for m in c["volumeMounts"]]


def test_seed_fanout_pins_runs_to_slots():
    job, opts = spec_job(nodes=1)
    slots = [k8s.Slot.parse("phortx1:0"), k8s.Slot.parse("phortx1:1"), k8s.Slot.parse("phortx2")]
    objs = k8s.render_seeds(job, opts, [1, 2, 3, 4], slots)
    validate_all(objs)
    jobs = [o for o in objs if o["kind"] == "Job"]
    assert [j["metadata"]["name"] for j in jobs] == ["train-s1-head", "train-s2-head", "train-s3-head", "train-s4-head"]
    pods = [j["spec"]["template"]["spec"] for j in jobs]
    assert [p["nodeSelector"]["kubernetes.io/hostname"] for p in pods] == ["phortx1", "phortx1", "phortx2", "phortx1"]
    envs = [{e["name"]: e.get("value") for e in p["containers"][0]["env"]} for p in pods]
    assert [e.get("CUDA_VISIBLE_DEVICES") for e in envs] == ["0", "1", None, "0"]
    assert envs[0]["NVIDIA_VISIBLE_DEVICES"] == "0" and "limits" not in pods[0]["containers"][0]["resources"]
    assert pods[2]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}  # whole node slot: a GPU limit
    assert [p["containers"][0]["args"][-2:] for p in pods] == [["--seed", str(s)] for s in (1, 2, 3, 4)]
    assert {o["metadata"]["labels"][k8s.LABEL_GROUP] for o in objs} == {"train"}
    with pytest.raises(DeployError, match="repeated seed"):
        k8s.render_seeds(job, opts, [1, 1])
    with pytest.raises(DeployError, match="NODE or NODE:GPU_INDEX"):
        k8s.Slot.parse("phortx1:zero")


RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["KUBECTL_RECORD"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read() if "-f" in sys.argv else ""}) + "\\n")
"""


def test_launch_sends_fresh_secrets_and_destroy_selects_what_was_rendered(tmp_path, monkeypatch):
    """kubectl is a recorder here (no API server on this machine): it checks what we hand to it."""
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(RECORDER)
    kubectl.chmod(stat.S_IRWXU)
    monkeypatch.setenv("KUBECTL_RECORD", str(tmp_path / "calls.jsonl"))
    job, opts = spec_job(nodes=2)
    objs = k8s.render_seeds(job, opts, [7, 8])
    k8s.launch(objs, opts.namespace, lambda: uuid.uuid4().hex * 2, kubectl_bin=str(kubectl))
    k8s.destroy("train", opts.namespace, kubectl_bin=str(kubectl))
    apply, delete = [json.loads(l) for l in (tmp_path / "calls.jsonl").read_text().splitlines()]
    items = json.loads(apply["stdin"])["items"]
    secrets = [i for i in items if i["kind"] == "Secret"]
    assert [s["metadata"]["name"] for s in secrets] == ["train-s7-ray-token", "train-s8-ray-token"]
    assert len({s["stringData"]["token"] for s in secrets}) == 2
    assert items[2:] == objs
    assert not any(s["stringData"]["token"] in k8s.dump(objs) for s in secrets)
    validate_all(secrets)
    selector = delete["argv"][delete["argv"].index("-l") + 1]
    key, value = selector.split("=")
    assert all(i["metadata"]["labels"][key] == value for i in items)
    assert delete["argv"][:2] == ["delete", k8s.kubectl.KINDS]


@pytest.mark.parametrize("serve, remove", [(False, "invoke destroy --target k8s --name train"), (True, "invoke down --name train")])
def test_submit_counts_every_object_it_applied_the_secret_included(tmp_path, monkeypatch, serve, remove):
    """--submit's line says how many objects kubectl was sent (the token Secret too), and how to remove
    them: a held cluster (invoke up) with `invoke down`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(RECORDER)
    (bin_dir / "kubectl").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KUBECTL_RECORD", str(tmp_path / "calls.jsonl"))
    monkeypatch.setattr(k8s.held, "wait_serving", lambda *a, **kw: K8sHandle(namespace="ml", job_name="job", head_pod="job-head-0"))  # no API server here
    job, _ = spec_job(nodes=2)
    job = job.model_copy(update={"serve": serve})
    spec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    opts = k8s.K8sFlags(submit=True)
    said = []
    k8s.TARGET.apply(k8s.TARGET.render(job, spec, opts), job, spec, opts,
                     ApplyContext(out_dir=tmp_path / "out", engine=None, progress=said.append))
    items = json.loads(json.loads((tmp_path / "calls.jsonl").read_text())["stdin"])["items"]
    assert [i["kind"] for i in items] == ["Secret", "Service", "Job", "Job"]
    line = next(m for m in said if m.startswith("applied "))
    assert line == f"applied 4 object(s) (1 Secret, 1 Service, 2 Job); remove them with `{remove}`"


def test_the_pull_secret_fix_is_the_readmes_command_from_the_docker_config_in_use(monkeypatch):
    """The missing image pull Secret's fix: the docs' command (docs/deploying.md), from $DOCKER_CONFIG/config.json when
    DOCKER_CONFIG is set (where `docker login` wrote it), else from $HOME/.docker/config.json."""
    job, opts = spec_job()
    opts = opts.model_copy(update={"image_pull_secret": "regcred"})
    view = k8s.kubectl.ClusterView(True, None, frozenset({"train-ray-token"}))

    def fix() -> str:
        problem, = k8s.cluster_problems(view, ["train-ray-token"], "train", opts, False, False)
        return problem.partition("create it from your docker login: ")[2]

    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    assert fix() == k8s.pull_secret_command("regcred", opts.namespace, {}) == (
        f'kubectl -n {opts.namespace} create secret docker-registry regcred '
        '--from-file=.dockerconfigjson="$HOME/.docker/config.json"')
    assert k8s.pull_secret_command("regcred", "NS", {}) in " ".join((ROOT / "docs" / "deploying.md").read_text().split())
    monkeypatch.setenv("DOCKER_CONFIG", "/elsewhere/docker")
    assert fix().endswith('--from-file=.dockerconfigjson="$DOCKER_CONFIG/config.json"')


def test_exact_container_specs_run_the_job(client, pushed, tmp_path):
    spec = load_spec(ROOT / "cluster_specs" / "local.json")
    opts = KubernetesOptions(namespace="e2e", fileroot_claim="shared")
    name = f"k8s-{uuid.uuid4().hex[:6]}"
    assert pushed["cpu"]["user"] == "1000:1000"
    job = jobs.job(pushed["cpu"]["repo_digest"], name=name, nodes=3, cpus_per_node=2, mounts=spec.mounts,
                   fileroot=spec.fileroot, command=["python", "train.py", "--cpus-per-worker", "0.5", "--steps", "20"],
                   image_info=jobs.info(pushed["cpu"]["repo_digest"], user=pushed["cpu"]["user"]))
    objs = list(yaml.safe_load_all(k8s.dump(k8s.render(job, opts))))  # exactly what a user would apply
    validate_all(objs)
    tokens = {f"{name}-ray-token": {"token": uuid.uuid4().hex * 2}}
    containers, network = k8s_docker.run_pods(client, objs, tokens)
    try:
        head = next(c for n, c in containers.items() if n.startswith(f"{name}-head-"))
        code = head.wait(timeout=420)["StatusCode"]
        logs = head.logs().decode(errors="replace")
        assert code == 0, logs[-3000:]
        summary = json.loads(next(l for l in logs.splitlines() if l.startswith("SUMMARY ")).split(" ", 1)[1])
        assert summary["nodes"] == 3 and summary["ranks_reported"] == [0, 1, 2]
        assert "identity from kubernetes: node 0 of 3" in logs
        assert f"node {k8s_docker.NODE_NAME}: node type cpu" in logs  # spec.nodeName, through the downward API
        # rank 0 saved its checkpoint into the fileroot volume as the pod's uid (exit 0 needs that write)
        deadline = time.monotonic() + 60
        for c in containers.values():
            assert c.wait(timeout=max(1, deadline - time.monotonic()))["StatusCode"] == 0
    finally:
        k8s_docker.cleanup(containers, network)


def pods_of(objs):
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Job"]


def test_every_rendered_pod_passes_pod_security_restricted():
    """What a namespace labelled pod-security.kubernetes.io/enforce=restricted admits: the one-job render,
    the seed fan-out and the slot-pinned runs. The checker is not a rubber stamp: the pod spec this target
    wrote before (privilege escalation off, nothing else) breaks it the way the real admission said."""
    job, opts = spec_job()
    renders = [k8s.render(job, opts), k8s.render_seeds(job, opts, [1, 2, 3]),
               k8s.render_seeds(job.model_copy(update={"nodes": 1}), opts, [4, 5], [k8s.Slot.parse("n1:0")])]
    for objs in renders:
        validate_all(objs)
        for pod in pods_of(objs):
            assert pod_security.violations(pod) == []
    old = pods_of(renders[0])[0]
    old = {**old, "securityContext": {k: v for k, v in old["securityContext"].items() if k != "seccompProfile"},
           "containers": [{**old["containers"][0], "securityContext": {"allowPrivilegeEscalation": False}}]}
    found = " / ".join(pod_security.violations(old))
    assert 'unrestricted capabilities (container "ray" must set securityContext.capabilities.drop=["ALL"])' in found
    assert 'seccompProfile (pod or container "ray" must set securityContext.seccompProfile.type to "RuntimeDefault"' in found
    # the spec's other mounts are hostPath volumes, which restricted refuses: not rendered unless asked for
    hosted, _ = spec_job(mounts=[{"source": "/data", "target": "/data"}])
    with pytest.raises(DeployError, match="hostPath volume, which Pod Security 'restricted'"):
        k8s.render(hosted, opts)
    privileged = k8s.render(hosted, opts.model_copy(update={"pod_security": "privileged"}))
    assert "hostPath volumes" in " ".join(pod_security.violations(pods_of(privileged)[0]))


def test_the_node_name_reaches_the_pods_and_disruptions_do_not_end_the_job():
    job, opts = spec_job(retries=1)
    svc, head, workers = k8s.render(job, opts)
    for j in (head, workers):
        env = j["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "RAYTRAIN_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env
        rules = j["spec"]["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
        assert rules[-1]["action"] == "FailJob" and rules[-1]["onExitCodes"]["values"] == [2]
        assert j["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
        requests = j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert requests["ephemeral-storage"] == "4Gi"
    # a worker that lost the head rejoins its next pod; each worker pod may be replaced (once per retry, plus one)
    assert {"action": "Ignore", "onExitCodes": {"containerName": "ray", "operator": "In", "values": [3]}} \
        in workers["spec"]["podFailurePolicy"]["rules"]
    assert workers["spec"]["backoffLimit"] == 2 * 2 and head["spec"]["backoffLimit"] == 1


@pytest.mark.parametrize("change,expect", [
    (dict(mounts=[{"source": "/a", "target": "/data"}, {"source": "/b", "target": "/data/"}]),
     "two volumes mount at '/data/'; a container's mountPath must be unique"),
    (dict(mounts=[{"source": "/a", "target": "/dev/shm"}]), "two volumes mount at '/dev/shm'"),
    (dict(time_limit="0"), "Kubernetes needs a positive activeDeadlineSeconds"),
    (dict(image_info=jobs.info(DIGEST, user="2147483648:1000")), "uid 2147483648 is outside 0..2147483647"),
    (dict(image_info=jobs.info(DIGEST, user="1000:4294967295")), "gid 4294967295 is outside 0..2147483647"),
])
def test_values_a_kube_apiserver_refuses_are_refused_before_rendering(change, expect):
    job, opts = spec_job(**change)
    opts = opts.model_copy(update={"pod_security": "privileged"})
    problems = k8s.spec_problems(job, opts)
    assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("section,expect", [
    ({"node_selector": {"": "x"}}, "label key ''"),
    ({"node_selector": {"nvidia.com/gpu product": "A100"}}, "label key 'nvidia.com/gpu product'"),
    ({"node_selector": {"Bad_Prefix/x": "y"}}, "the prefix before '/' must be a DNS subdomain"),
    ({"node_selector": {"gpu": "A100 80GB"}}, "label value 'A100 80GB'"),
    ({"image_pull_secret": "Reg_Cred"}, "'Reg_Cred' is not a valid object name (DNS-1123 subdomain)"),
    ({"fileroot_claim": "-shared"}, "'-shared' is not a valid object name"),
    ({"fileroot_claim": "a" * 254}, "is not a valid object name"),
    ({"namespace": "ML"}, "'ML' is not a DNS-1123 label"),
    ({"ephemeral_storage": "4G"}, "is not a quantity such as 4Gi"),
    ({"pod_security": "baseline"}, "'restricted' or 'privileged'"),
])
def test_spec_values_are_checked_with_the_apiservers_rules(section, expect):
    from runtime.spec import SpecError, parse_spec
    raw = json.loads((ROOT / "cluster_specs" / "kubernetes.json").read_text())
    raw["kubernetes"] = {**raw["kubernetes"], **section}
    with pytest.raises(SpecError) as e:
        parse_spec(raw, "spec.json")
    assert expect in str(e.value) and "kubernetes." in str(e.value)
    # the same values are accepted when they keep the rules
    ok = {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "zone": ""},
          "image_pull_secret": "regcred.v2", "fileroot_claim": "a" * 253, "namespace": "ml-training",
          "ephemeral_storage": "500Mi", "pod_security": "privileged"}
    raw["kubernetes"] = {**raw["kubernetes"], **{k: ok[k] for k in section}}
    parse_spec(raw, "spec.json")


FAKE_CLUSTER = """#!/usr/bin/env python3
# kubectl as a cluster with the state in $FAKE_CLUSTER answers `get namespace NS -o json` and
# `get secrets -n NS -o name`, with kubectl's own NotFound text and exit code
import json, os, sys
state = json.load(open(os.environ["FAKE_CLUSTER"]))
a = sys.argv[1:]
if a[:2] == ["get", "namespace"]:
    ns = state["namespaces"].get(a[2])
    if ns is None:
        sys.exit(print(f'Error from server (NotFound): namespaces "{a[2]}" not found', file=sys.stderr) or 1)
    print(json.dumps({"kind": "Namespace", "metadata": {"name": a[2], "labels": ns}}))
elif a[:2] == ["get", "secrets"]:
    print("\\n".join("secret/" + s for s in state["secrets"].get(a[a.index("-n") + 1], [])))
else:
    sys.exit(print("unexpected: " + " ".join(a), file=sys.stderr) or 1)
"""


def test_site_check_names_a_missing_namespace_or_secret_and_refuses_to_write(tmp_path, monkeypatch):
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(FAKE_CLUSTER)
    kubectl.chmod(stat.S_IRWXU)
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    state = tmp_path / "state.json"
    monkeypatch.setenv("PATH", f"{kubectl.parent}:/usr/bin:/bin")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("FAKE_CLUSTER", str(state))
    job, opts = spec_job()
    spec = load_spec(ROOT / "cluster_specs" / "kubernetes.json")
    flags = k8s.TARGET.parse_options({})

    def check(namespaces, secrets, flags=flags):
        state.write_text(json.dumps({"namespaces": namespaces, "secrets": secrets}))
        return k8s.TARGET.site_check(job, spec, flags)

    missing_ns = check({}, {})
    assert "namespace 'ml-training' does not exist" in missing_ns.problems[0]
    assert "kubectl create namespace ml-training" in missing_ns.problems[0]
    no_secret = check({"ml-training": {}}, {"ml-training": ["other"]})
    assert "Secret 'train-ray-token'" in no_secret.problems[0]
    assert "kubectl -n ml-training create secret generic train-ray-token" in no_secret.problems[0]
    assert check({"ml-training": {}}, {"ml-training": ["train-ray-token"]}).problems == []
    pulls = spec.model_copy(update={"kubernetes": spec.kubernetes.model_copy(update={"image_pull_secret": "regcred"})})
    state.write_text(json.dumps({"namespaces": {"ml-training": {}}, "secrets": {"ml-training": ["train-ray-token"]}}))
    assert "Secret 'regcred' is not in namespace" in k8s.TARGET.site_check(job, pulls, flags).problems[0]
    hosted_job = job.model_copy(update={"mounts": [*job.mounts, type(job.mounts[0])(source="/d", target="/d")]})
    privileged = spec.model_copy(update={"kubernetes": spec.kubernetes.model_copy(update={"pod_security": "privileged"})})
    state.write_text(json.dumps({"namespaces": {"ml-training": {"pod-security.kubernetes.io/enforce": "restricted"}},
                                 "secrets": {"ml-training": ["train-ray-token"]}}))
    assert "enforces Pod Security 'restricted'" in k8s.TARGET.site_check(hosted_job, privileged, flags).problems[0]
    submit = k8s.TARGET.parse_options({"submit": True})
    assert check({"ml-training": {}}, {"ml-training": []}, submit).problems == []  # --submit creates it
    # no kubeconfig: --submit is refused, written files come with a note on what must exist
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    offline = k8s.TARGET.site_check(job, spec, flags)
    assert offline.problems == [] and "create secret generic train-ray-token" in offline.notes[0]
    assert "cannot ask the cluster" in k8s.TARGET.site_check(job, spec, submit).problems[0]

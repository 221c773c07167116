"""Run the pods of rendered Kubernetes Jobs as Docker containers, taking the container specs as written.

Image, command, args, env, workingDir and the /dev/shm emptyDir come from the manifest unchanged.
What a cluster would add is added the way Kubernetes does: KUBERNETES_SERVICE_HOST,
JOB_COMPLETION_INDEX for Indexed Jobs, HOSTNAME, the Secret's value for secretKeyRef, the node's
name for a fieldRef to spec.nodeName (NODE_NAME here), and the headless Service's DNS name as a
network alias of the pods it selects. A PVC becomes a tmpfs
owned by root, mode 0755, as a fresh volume is (no volume provisioner here); with fsGroup it is
group-owned by that gid with the setgid bit and group write, as the kubelet makes it. hostPath
volumes become bind mounts.

Before a container starts, the kubelet's own checks are applied (`verify_run_as_non_root`, after
kubelet's verifyRunAsNonRoot), and the container runs as the uid:gid the pod spec resolves to,
with fsGroup as a supplementary group, as a kubelet would run it. Docker makes none of these checks.
The container's securityContext is applied as containerd applies it: capabilities.drop as the
dropped capabilities, allowPrivilegeEscalation=false as no_new_privs, seccomp RuntimeDefault as the
engine's default profile.
"""
from __future__ import annotations

import secrets

NODE_NAME = "k8s-node-7"  # the node every emulated pod is "scheduled" to


class KubeletRefused(RuntimeError):
    """What a kubelet reports as CreateContainerConfigError."""


def image_user(user: str) -> tuple[int | None, str]:
    """The image config's User as kubelet reads it: (uid, "") when numeric, (None, name) otherwise;
    an empty User is root."""
    name = (user or "").split(":", 1)[0]
    if not name:
        return 0, ""
    return (int(name), "") if name.isdigit() else (None, name)


def effective_security(pod_spec: dict, container: dict) -> dict:
    """The container's securityContext over the pod's, field by field."""
    return {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}


def verify_run_as_non_root(pod_spec: dict, container: dict, image_config_user: str) -> None:
    sc = effective_security(pod_spec, container)
    if not sc.get("runAsNonRoot"):
        return
    if sc.get("runAsUser") is not None:
        if sc["runAsUser"] == 0:
            raise KubeletRefused("container's runAsUser breaks non-root policy")
        return
    uid, name = image_user(image_config_user)
    if uid == 0:
        raise KubeletRefused("container has runAsNonRoot and image will run as root")
    if uid is None:
        raise KubeletRefused(f"container has runAsNonRoot and image has non-numeric user ({name}), "
                             "cannot verify user is non-root")


def run_as(pod_spec: dict, container: dict, image_config_user: str) -> tuple[str, list[int]]:
    """('uid:gid', supplementary groups) the container process gets."""
    sc = effective_security(pod_spec, container)
    uid, _ = image_user(image_config_user)
    img_gid = (image_config_user or "").partition(":")[2]
    user = str(sc["runAsUser"]) if sc.get("runAsUser") is not None else (image_config_user or "0").split(":")[0]
    gid = sc.get("runAsGroup", int(img_gid) if img_gid.isdigit() else 0)
    fs_group = (pod_spec.get("securityContext") or {}).get("fsGroup")
    return f"{user}:{gid}", [fs_group] if fs_group is not None else []


def _shm_bytes(limit: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for u, f in units.items():
        if limit.endswith(u):
            return int(limit[:-2]) * f
    return int(limit)


def pods(objs: list[dict]) -> list[tuple[dict, dict, dict]]:
    """(job, pod template, extra env) per pod the Jobs would create."""
    out = []
    for o in objs:
        if o["kind"] != "Job":
            continue
        spec = o["spec"]
        for i in range(spec["completions"]):
            extra = {"JOB_COMPLETION_INDEX": str(i)} if spec.get("completionMode") == "Indexed" else {}
            out.append((o, spec["template"], extra))
    return out


def run_pods(client, objs: list[dict], tokens: dict, run_id: str | None = None):
    """Start every pod; return (containers by pod name, network). The caller removes both."""
    run_id = run_id or secrets.token_hex(3)
    services = [o for o in objs if o["kind"] == "Service"]
    network = client.networks.create(f"k8s-e2e-{run_id}", driver="bridge")
    started = {}
    try:
        for job, template, extra in reversed(pods(objs)):  # workers first, as a scheduler might
            pod_labels = template["metadata"]["labels"]
            aliases = [s["metadata"]["name"] for s in services
                       if all(pod_labels.get(k) == v for k, v in s["spec"]["selector"].items())]
            c = template["spec"]["containers"][0]
            env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", **extra}
            for e in c["env"]:
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif "fieldRef" in e["valueFrom"]:
                    if e["valueFrom"]["fieldRef"]["fieldPath"] != "spec.nodeName":
                        raise NotImplementedError(f"fieldRef {e['valueFrom']['fieldRef']}")
                    env[e["name"]] = NODE_NAME
                else:
                    ref = e["valueFrom"]["secretKeyRef"]
                    env[e["name"]] = tokens[ref["name"]][ref["key"]]
            pod_spec = template["spec"]
            image_cfg_user = client.images.get(c["image"]).attrs["Config"].get("User") or ""
            verify_run_as_non_root(pod_spec, c, image_cfg_user)
            user, groups = run_as(pod_spec, c, image_cfg_user)
            fs_group = (pod_spec.get("securityContext") or {}).get("fsGroup")
            shm = next(v["emptyDir"]["sizeLimit"] for v in template["spec"]["volumes"] if v["name"] == "dshm")
            volumes = {v["name"]: v for v in template["spec"]["volumes"]}
            tmpfs, binds = {}, {}
            for m in c["volumeMounts"]:
                v = volumes[m["name"]]
                if "persistentVolumeClaim" in v:
                    tmpfs[m["mountPath"]] = f"mode=2775,gid={fs_group}" if fs_group is not None else "mode=0755"
                elif "hostPath" in v:
                    binds[v["hostPath"]["path"]] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
            csc = c.get("securityContext") or {}
            cap_drop = list((csc.get("capabilities") or {}).get("drop") or [])
            seccomp = effective_security(pod_spec, c).get("seccompProfile", {}).get("type", "RuntimeDefault")
            if seccomp != "RuntimeDefault":
                raise NotImplementedError(f"seccompProfile {seccomp}")
            security_opt = ["no-new-privileges"] if csc.get("allowPrivilegeEscalation") is False else []
            name = f"{job['metadata']['name']}-{extra.get('JOB_COMPLETION_INDEX', '0')}-{run_id}"
            env["HOSTNAME"] = name
            api = client.api
            created = api.create_container(
                c["image"], command=c["args"], entrypoint=c["command"], environment=env, name=name,
                hostname=name[:63], working_dir=c.get("workingDir"), labels={"io.raytrain.k8s-e2e": run_id},
                user=user,
                host_config=api.create_host_config(network_mode=network.name, shm_size=_shm_bytes(shm),
                                                   tmpfs=tmpfs, binds=binds, group_add=groups,
                                                   cap_drop=cap_drop, security_opt=security_opt),
                networking_config=api.create_networking_config(
                    {network.name: api.create_endpoint_config(aliases=aliases)}))
            container = client.containers.get(created["Id"])
            container.start()
            started[name] = container
        return started, network
    except Exception:
        cleanup(started, network)
        raise


def cleanup(containers: dict, network) -> None:
    for c in containers.values():
        try:
            c.remove(force=True)
        except Exception:
            pass
    network.remove()


def docker_registry_secret(name: str, namespace: str, server: str, username: str, password: str) -> dict:
    """The Secret `kubectl create secret docker-registry` makes: type kubernetes.io/dockerconfigjson."""
    import base64
    import json
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    config = {"auths": {server: {"username": username, "password": password, "auth": auth}}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace},
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}}


def pull_as_kubelet(client, pod_spec: dict, secrets_by_name: dict) -> None:
    """Pull the pod's image as a kubelet does: the credentials of each imagePullSecret whose
    .dockerconfigjson names the image's registry are tried in order, then an anonymous pull.
    A failure is ErrImagePull with the registry's answer."""
    import base64
    import json
    image = pod_spec["containers"][0]["image"]
    registry = image.split("/", 1)[0]
    repo, _, digest = image.partition("@")
    tried = []
    for ref in pod_spec.get("imagePullSecrets", []):
        secret = secrets_by_name.get(ref["name"])
        if secret is None:
            continue  # a kubelet logs it and goes on without
        config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
        cred = config.get("auths", {}).get(registry)
        if cred:
            tried.append({"username": cred["username"], "password": cred["password"]})
    errors = []
    for auth in [*tried, None]:
        try:
            # the engine reports a refused pull inside the stream as often as in the HTTP status; anonymous is
            # an explicit empty credential: docker-py would otherwise send this machine's own docker login
            failed = [c["error"] for c in client.api.pull(repo, tag=digest, auth_config=auth or {}, stream=True,
                                                          decode=True) if "error" in c]
        except Exception as e:  # docker.errors.APIError
            failed = [str(e)]
        if not failed:
            return
        errors.append(f"{'with ' + auth['username'] if auth else 'anonymous'}: {failed[0][-250:]}")  # the cause is at the end
    raise KubeletRefused(f"ErrImagePull: {image}: {' | '.join(errors)}")

"""Run the pods of rendered Kubernetes Jobs as Docker containers, taking the container specs as written.

Image, command, args, env, workingDir and the /dev/shm emptyDir come from the manifest unchanged.
What a cluster would add is added the way Kubernetes does: KUBERNETES_SERVICE_HOST,
JOB_COMPLETION_INDEX for Indexed Jobs, HOSTNAME, the Secret's value for secretKeyRef, and the
headless Service's DNS name as a network alias of the pods it selects. A PVC becomes a tmpfs
(no volume provisioner here); hostPath volumes become bind mounts.
"""
from __future__ import annotations

import secrets


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
                else:
                    ref = e["valueFrom"]["secretKeyRef"]
                    env[e["name"]] = tokens[ref["name"]][ref["key"]]
            shm = next(v["emptyDir"]["sizeLimit"] for v in template["spec"]["volumes"] if v["name"] == "dshm")
            volumes = {v["name"]: v for v in template["spec"]["volumes"]}
            tmpfs, binds = {}, {}
            for m in c["volumeMounts"]:
                v = volumes[m["name"]]
                if "persistentVolumeClaim" in v:
                    tmpfs[m["mountPath"]] = "mode=1777"
                elif "hostPath" in v:
                    binds[v["hostPath"]["path"]] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
            name = f"{job['metadata']['name']}-{extra.get('JOB_COMPLETION_INDEX', '0')}-{run_id}"
            env["HOSTNAME"] = name
            api = client.api
            created = api.create_container(
                c["image"], command=c["args"], entrypoint=c["command"], environment=env, name=name,
                hostname=name[:63], working_dir=c.get("workingDir"), labels={"io.raytrain.k8s-e2e": run_id},
                host_config=api.create_host_config(network_mode=network.name, shm_size=_shm_bytes(shm),
                                                   tmpfs=tmpfs, binds=binds),
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

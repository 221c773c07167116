"""The Pod Security Standards' `restricted` profile (baseline included), as a checker of pod specs.

The checks and their order follow k8s.io/pod-security-admission/policy (v1.26), which a kube-apiserver
runs when a namespace is labelled pod-security.kubernetes.io/enforce=restricted; each message names the
field as the admission message does. The real admission ran by hand on a real kube-apiserver (the README
says what ran); this checker keeps every rendered pod spec honest in the suite.
"""
from __future__ import annotations

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}


def _containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def violations(pod: dict) -> list[str]:
    """Every way the pod spec breaks `restricted`; [] when it passes."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    cs = _containers(pod)
    # --- baseline ---
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(ns):
            out.append(f"host namespaces ({ns}=true)")
    for c in cs:
        sc = c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess") or (psc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f'hostProcess (container "{c["name"]}")')
        if sc.get("privileged"):
            out.append(f'privileged (container "{c["name"]}" must not set securityContext.privileged=true)')
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPS:
            out.append(f'non-default capabilities (container "{c["name"]}" must not include {sorted(added - BASELINE_CAPS)})')
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f'hostPort (container "{c["name"]}" uses hostPort)')
        if (sc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
            out.append(f'seLinuxOptions (container "{c["name"]}")')
        if sc.get("procMount", "Default") != "Default":
            out.append(f'procMount (container "{c["name"]}" must not set securityContext.procMount)')
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out.append(f'hostPath volumes (volume "{v["name"]}")')
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"forbidden sysctls ({s.get('name')})")
    # --- restricted ---
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f'restricted volume types (volume "{v["name"]}" uses {sorted(kinds - RESTRICTED_VOLUMES)})')
    for c in cs:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f'allowPrivilegeEscalation != false (container "{c["name"]}" must set '
                       "securityContext.allowPrivilegeEscalation=false)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f'unrestricted capabilities (container "{c["name"]}" must set '
                       'securityContext.capabilities.drop=["ALL"])')
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f'unrestricted capabilities (container "{c["name"]}" must not include '
                       f'{sorted(set(caps["add"]) - {"NET_BIND_SERVICE"})} in securityContext.capabilities.add)')
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f'runAsNonRoot != true (container "{c["name"]}" must set securityContext.runAsNonRoot=true)')
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f'runAsUser=0 (container "{c["name"]}" must not set runAsUser=0)')
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f'seccompProfile (pod or container "{c["name"]}" must set securityContext.seccompProfile.type to '
                       '"RuntimeDefault" or "Localhost")')
    if psc.get("runAsUser") == 0:
        out.append("runAsUser=0 (pod must not set runAsUser=0)")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append('seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")')
    return out

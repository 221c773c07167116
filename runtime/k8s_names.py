"""Kubernetes' own rules for the values a kube-apiserver validates, checked before anything is rendered.

The patterns and lengths are apimachinery's (k8s.io/apimachinery/pkg/util/validation): a DNS-1123 label
(namespaces), a DNS-1123 subdomain (Secret and PersistentVolumeClaim names), a qualified name
(label keys: an optional DNS subdomain prefix and '/', then a name of at most 63) and a label value. Each check returns None or the problem in words a user can act on, so the spec and the
manifests report the same rule the same way. Every match is a `fullmatch`.
"""
from __future__ import annotations

import re
from typing import Optional

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = QUALIFIED_NAME
MAX_ID = 2**31 - 1  # runAsUser, runAsGroup and fsGroup: 0..2147483647


def dns1123_label(value: str) -> Optional[str]:
    if len(value) > 63 or not DNS1123_LABEL.fullmatch(value):
        return (f"{value[:80]!r} is not a DNS-1123 label: at most 63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit")
    return None


def dns1123_subdomain(value: str) -> Optional[str]:
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
        return (f"{value[:80]!r} is not a valid object name (DNS-1123 subdomain): at most 253 lowercase letters, "
                "digits, '-' and '.', starting and ending with a letter or digit")
    return None


def label_key(value: str) -> Optional[str]:
    """[prefix/]name: prefix a DNS-1123 subdomain of at most 253, name at most 63 of [-A-Za-z0-9_.],
    starting and ending alphanumeric."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or dns1123_subdomain(prefix)):
        return f"label key {value[:80]!r}: the prefix before '/' must be a DNS subdomain such as example.com"
    if len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
        return (f"label key {value[:80]!r}: the name part must be 1-63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit (e.g. nvidia.com/gpu.product)")
    return None


def label_value(value: str) -> Optional[str]:
    if value and (len(value) > 63 or not LABEL_VALUE.fullmatch(value)):
        return (f"label value {value[:80]!r}: at most 63 letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit (or empty)")
    return None


def id_in_range(value: int, field: str) -> Optional[str]:
    if not 0 <= value <= MAX_ID:
        return f"{field} {value} is outside 0..{MAX_ID}, the range a kube-apiserver accepts"
    return None

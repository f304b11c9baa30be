"""What the API server refuses whatever the kind: invalid names and labels, changes to immutable fields.
Each returns the API server's wording of the problem, or None."""

from __future__ import annotations

import re
from typing import Any

from harness.kube.resources import Res

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1035: Services
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def invalid_name(res: Res, name: str) -> str | None:
    if res.kind == "Service" and not _DNS_LABEL.match(name):
        return (f'metadata.name: Invalid value: "{name}": a DNS-1035 label must consist of lower case alphanumeric '
                "characters or '-', start with an alphabetic character, end with an alphanumeric character, and be "
                "at most 63 characters")
    if res.kind not in ("Service", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding") and \
            not _DNS_SUBDOMAIN.match(name):
        return f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain is required'
    return None


def invalid_labels(labels: dict[str, str]) -> str | None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name):
            return f'metadata.labels: Invalid value: "{key}": a label key must be a qualified name'
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            return f'metadata.labels: Invalid value: "{value}": a label value must be at most 63 characters of ' \
                   "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric character"
    return None


def immutable(res: Res, old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Fields the API server refuses to change after creation."""
    fields = {"Deployment": ("selector",), "Service": ("clusterIP",)}.get(res.kind, ())
    for field in fields:
        before, after = (old.get("spec") or {}).get(field), (new.get("spec") or {}).get(field)
        if before and after != before:
            return f"spec.{field}: Invalid value: {after!r}: field is immutable"
    return None

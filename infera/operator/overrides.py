"""A pool's ``podTemplate`` merged over the pod template the operator builds.

The merge is Kubernetes' strategic merge for the fields a pod template has: maps merge key by key;
the lists whose items have a name (containers, init containers, volumes, env, ports, volume mounts,
image pull secrets) merge item by item on that key, so an override can add a volume and mount it in
the ``worker`` container without restating the container; any other list or value replaces. Pure.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name"}


def merge(base: Any, override: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(override, list):
        out_list = [copy.deepcopy(item) for item in base]
        for item in override:
            at = next((i for i, b in enumerate(out_list) if isinstance(item, dict) and isinstance(b, dict)
                       and b.get(key) == item.get(key)), None)
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = merge(out_list[at], item, field)
        return out_list
    return copy.deepcopy(override)

"""Small HTTP probes over urllib (no event loop needed): health, JSON, Prometheus samples."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bool(resp.status == 200)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """``(status, body)``; ``(0, b"")`` when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except (OSError, ValueError):
        return 0, b""


def scrape(url: str) -> str:
    """The Prometheus exposition at ``<url>/metrics``."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0.0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0

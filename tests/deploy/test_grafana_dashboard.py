"""The Grafana dashboard names only metrics that infera's processes really export.

Every panel's PromQL is parsed (promql-parser, the Rust parser's Python binding) and each
metric it selects must appear in a live scrape of a frontend and a mock engine that served
a request, or in the endpoint picker's registry, so the dashboard cannot rot silently when a
metric is renamed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from openai import OpenAI
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness import scrape, start_frontend, start_mock
from infera.picker.metrics import PickerMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "infera-dashboard.json"
CHART_COPY = REPO / "charts" / "infera" / "dashboards" / "infera-dashboard.json"
MODEL = "Qwen/Qwen3-0.6B"
# Grafana's own variables, replaced by values PromQL can parse.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$job": ".*"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
            "unknown": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount"), "stateset": ("",)}


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield f"variable {var['name']}", var["query"]


def selected_metrics(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (Grafana variables substituted first)."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    label_values = re.fullmatch(r"label_values\((\w[\w:]*),\s*\w+\)", expr.strip())
    if label_values:  # Grafana's template-variable query, not PromQL
        return {label_values.group(1)}
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            return
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if isinstance(child, promql_parser.Expr):
                walk(child)
        for child in getattr(node, "args", None) or []:
            walk(child)

    walk(promql_parser.parse(expr))
    return names


def exported_names(exposition: str) -> set[str]:
    """Every sample name an exposition can carry, labelled families without samples included."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def picker_names() -> set[str]:
    """The endpoint picker's metrics, from its own registry (the gateway tests run it behind Envoy)."""
    metrics = PickerMetrics(in_flight=lambda: 0.0, workers=lambda: 0.0)
    return exported_names(generate_latest(metrics.registry).decode())


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_the_parser_finds_every_selected_metric() -> None:
    expr = ('sum by (w) (rate(a_total{job=~"$job"}[$__rate_interval])) / clamp_min(sum(rate(b:c_total[5m])), 1)'
            ' + histogram_quantile(0.9, sum by (le) (rate(d_bucket[1m]))) + max_over_time(e[5m:1m])')
    assert selected_metrics(expr) == {"a_total", "b:c_total", "d_bucket", "e"}
    assert selected_metrics("label_values(infera_fleet_workers, job)") == {"infera_fleet_workers"}


def test_dashboard_is_well_formed() -> None:
    dash = load_dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel["description"], f"panel {panel['title']!r} says nothing about what it shows"
    assert CHART_COPY.read_bytes() == DASHBOARD.read_bytes(), "the chart ships a stale copy of the dashboard"


@pytest.mark.e2e
def test_every_panel_names_exported_metrics(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    mock = start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL,
                      args=("--block-size", "16", "--speedup-ratio", "50"))
    try:
        frontend = start_frontend(tmp_path, [mock], tokenizer=qwen_tokenizer_dir)
        try:
            client = OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0)
            for _ in client.chat.completions.create(model=MODEL, max_tokens=4, stream=True,
                                                    messages=[{"role": "user", "content": "hello"}]):
                pass
            exported = exported_names(scrape(frontend.url)) | exported_names(scrape(mock.url)) | picker_names()
        finally:
            frontend.stop()
    finally:
        mock.stop()
    missing = {f"{title}: {name}" for title, expr in queries(load_dashboard())
               for name in selected_metrics(expr) if name not in exported}
    assert not missing, "dashboard queries name metrics nobody exports:\n" + "\n".join(sorted(missing))

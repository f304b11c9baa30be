"""The README's metrics reference matches the code, and covers every metric a scrape really carries.

The reference is generated from the registries (``python -m harness.metrics_reference --write``);
these tests fail when someone adds or changes a metric without regenerating it, and when a scrape
carries a sample name the reference does not list (a collector the generator misses).
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness import scrape, start_frontend, start_mock
from harness.metrics_reference import END, README, START, components, exposed_names, main, render, splice
from infera.engine.mock.metrics import EngineMetrics
from infera.picker.metrics import PickerMetrics
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app
from tests.fakes import MODEL, FakeFleet, FakeTransport, worker


def sample_names(exposition: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def test_readme_reference_is_up_to_date() -> None:
    readme = README.read_text()
    assert splice(readme, render(components())) == readme, \
        "README.md's metrics reference is stale: run python -m harness.metrics_reference --write"
    assert main(["--check"]) == 0


def test_check_fails_and_write_repairs_a_stale_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(README.read_text().replace("| Routable workers by role |", "| Workers |"))
    monkeypatch.setattr("harness.metrics_reference.README", stale)
    assert main(["--check"]) == 1
    assert "+| `infera_fleet_workers` | gauge | `role` | Routable workers by role |" in capsys.readouterr().out
    assert main(["--write"]) == 0 and main(["--check"]) == 0
    assert stale.read_text() == README.read_text()


def test_a_new_section_goes_right_after_the_dashboard() -> None:
    readme = "# x\n\n## Dashboard\n\ntext\n\n## Next\n\nmore\n"
    section = f"{START}\n## Metrics reference\n{END}\n"
    out = splice(readme, section)
    assert out == f"# x\n\n## Dashboard\n\ntext\n\n{section}\n## Next\n\nmore\n"
    assert splice(out, section) == out
    assert splice(out, section.replace("reference", "ref")) == out.replace("reference", "ref")


async def test_every_sample_of_a_live_in_process_scrape_is_in_the_reference() -> None:
    router = Router(FakeFleet(worker("w1")), FakeTransport(None, text="hello"), None, None,
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=1 << 16, strip_patterns=[])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://infera") as client:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        frontend = (await client.get("/metrics")).text
    engine = EngineMetrics(MODEL)
    engine.ttft.observe(0.01)
    engine.hits.inc(16)
    engine.finished("stop", prompt_tokens=8, generation_tokens=3, e2e_seconds=0.05)
    picker = PickerMetrics(in_flight=lambda: 1.0, workers=lambda: 2.0)
    picker.picks.labels("placed").inc()
    picker.pick_seconds.observe(0.0003)

    scraped = sample_names(frontend) | sample_names(engine.render().decode()) \
        | sample_names(generate_latest(picker.registry).decode())
    assert {"infera_requests_total", "infera_routing_decisions_total", "vllm:request_success_total",
            "infera_picker_picks_total"} <= scraped, "the scrape should carry the exercised metrics"
    missing = scraped - exposed_names(components())
    assert not missing, f"scraped but not in the metrics reference: {sorted(missing)}"


@pytest.mark.e2e
def test_real_processes_export_nothing_the_reference_misses(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    model = "Qwen/Qwen3-0.6B"
    mock = start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=model,
                      args=("--block-size", "16", "--speedup-ratio", "50"))
    try:
        frontend = start_frontend(tmp_path, [mock], tokenizer=qwen_tokenizer_dir)
        try:
            client = OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0)
            client.completions.create(model=model, prompt="hello there", max_tokens=4)
            scraped = sample_names(scrape(frontend.url)) | sample_names(scrape(mock.url))
        finally:
            frontend.stop()
    finally:
        mock.stop()
    missing = scraped - exposed_names(components())
    assert not missing, f"scraped but not in the metrics reference: {sorted(missing)}"

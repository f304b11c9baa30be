"""The span tree of a request: routed, retried on another worker, and sent to a prefill+decode pair
(in process, the SDK's in-memory exporter)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from infera.kv.tokenizer import PromptRenderer
from tests.fakes import MODEL, worker
from tests.telemetry.conftest import FailFirst, Traced, one, tree

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5}
ROOT = "POST /v1/chat/completions"


async def test_a_routed_request_is_one_trace_with_intake_tokenize_pick_and_its_leg(tiny_tokenizer_dir: Path) -> None:
    t = Traced(worker("w1"), worker("w2"), policy="kv-aware", renderer=PromptRenderer.from_dir(str(tiny_tokenizer_dir)))
    async with t.client() as client:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 200
    spans = t.spans()
    assert tree(spans) == {ROOT: ["intake", "tokenize", "pick", "leg mixed"], "intake": [], "tokenize": [],
                           "pick": [], "leg mixed": []}
    assert len({s.context.trace_id for s in spans}) == 1
    root, pick, leg = one(spans, ROOT), one(spans, "pick"), one(spans, "leg mixed")
    assert root.kind == SpanKind.SERVER and leg.kind == SpanKind.CLIENT
    chosen = resp.headers["x-infera-worker"]
    assert pick.attributes is not None and leg.attributes is not None and root.attributes is not None
    assert pick.attributes["infera.policy"] == "kv-aware" and pick.attributes["infera.worker"] == chosen
    assert pick.attributes["infera.candidates"] == 2 and "infera.reason" in pick.attributes
    assert "infera.cost" in pick.attributes and "infera.overlap_blocks" in pick.attributes
    assert [e.name for e in leg.events] == ["first_byte"] and leg.attributes["infera.worker"] == chosen
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["infera.output_tokens"] == 2
    tokenize = one(spans, "tokenize").attributes or {}
    assert tokenize["infera.tokenized"] is True and tokenize["infera.prompt_tokens"] > 3
    # the leg ends when the response does: after its first byte, inside the root
    assert root.start_time is not None and root.end_time is not None and leg.end_time is not None
    assert root.start_time <= leg.start_time and leg.end_time <= root.end_time  # type: ignore[operator]
    # the engine is asked to continue the leg's span
    sent = t.transport.calls[0].headers["traceparent"]
    assert sent.startswith(f"00-{leg.context.trace_id:032x}-{leg.context.span_id:016x}-")
    assert int(sent[-2:], 16) & 1  # sampled
    assert resp.headers["x-request-id"]


async def test_a_client_traceparent_is_continued() -> None:
    t = Traced(worker("w1"))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with t.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT,
                                 headers={"traceparent": parent, "x-request-id": "req-7"})
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "req-7"
    root = one(t.spans(), ROOT)
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent is not None and f"{root.parent.span_id:016x}" == "b7ad6b7169203331"
    assert t.transport.calls[0].headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


async def test_a_retried_request_has_a_failed_leg_then_a_sibling_leg_on_another_worker() -> None:
    t = Traced(worker("w1"), worker("w2"), transport=FailFirst(text="hello there"))
    async with t.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200
    spans = t.spans()
    assert tree(spans)[ROOT] == ["intake", "tokenize", "pick", "leg mixed", "pick", "leg mixed"]
    failed, served = sorted((s for s in spans if s.name == "leg mixed"), key=lambda s: s.start_time or 0)
    assert failed.status.status_code == StatusCode.ERROR and "unreachable" in (failed.status.description or "")
    assert [e.name for e in failed.events] == [] and [e.name for e in served.events] == ["first_byte"]
    assert failed.attributes is not None and served.attributes is not None
    assert failed.attributes["infera.worker"] != served.attributes["infera.worker"]
    assert served.attributes["infera.worker"] == resp.headers["x-infera-worker"]
    (line,) = t.lines()
    assert line["failed_workers"] == [failed.attributes["infera.worker"]]
    assert line["workers"] == [resp.headers["x-infera-worker"]]


@pytest.mark.parametrize("connector", ["pull", "push"])
async def test_a_prefill_decode_request_has_a_prefill_and_a_decode_leg(connector: str) -> None:
    t = Traced(worker("p1", "prefill", connector=connector), worker("d1", "decode", connector=connector))
    async with t.client() as client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "once", "max_tokens": 3})
    assert resp.status_code == 200
    spans = t.spans()
    children = tree(spans)["POST /v1/completions"]
    assert children[:4] == ["intake", "tokenize", "pick", "pick"]
    assert sorted(children[4:]) == ["leg decode", "leg prefill"]
    picks = [s for s in spans if s.name == "pick"]
    assert {(p.attributes or {}).get("infera.role") for p in picks} == {"prefill", "decode"}
    prefill, decode = one(spans, "leg prefill"), one(spans, "leg decode")
    assert (prefill.attributes or {})["infera.worker"] == "p1" and (decode.attributes or {})["infera.worker"] == "d1"
    assert [e.name for e in decode.events] == ["first_byte"]
    sent = {c.worker: c.headers["traceparent"] for c in t.transport.calls}
    assert sent["p1"].split("-")[2] == f"{prefill.context.span_id:016x}"
    assert sent["d1"].split("-")[2] == f"{decode.context.span_id:016x}"
    (line,) = t.lines()
    assert line["workers"] == ["p1", "d1"] if connector == "pull" else sorted(line["workers"]) == ["d1", "p1"]
    assert line["policy"] == "round-robin"


async def test_intake_errors_end_in_a_traced_400_and_non_inference_paths_are_not_traced() -> None:
    t = Traced(worker("w1"))
    async with t.client() as client:
        bad = await client.post("/v1/chat/completions", content=b"{not json")
        await client.get("/v1/models")
    assert bad.status_code == 400
    spans = t.spans()
    assert sorted(s.name for s in spans) == sorted([ROOT, "intake"])
    assert (one(spans, ROOT).attributes or {})["http.response.status_code"] == 400
    assert orjson.loads(t.log.getvalue())["status"] == 400

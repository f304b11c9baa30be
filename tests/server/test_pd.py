"""Prefill/decode disaggregation end to end: mock prefill and decode processes, both connectors, the SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from harness import Process, metric, scrape, start_frontend, start_mock, wait_indexed, wait_until
from harness import in_flight as in_flight_total
from tests.server.conftest import MODEL
from tests.server.test_routing import system_prompt

pytestmark = pytest.mark.slow  # spawns fleets of real processes

PD_ARGS = ("--block-size", "16", "--num-kv-blocks", "2048", "--speedup-ratio", "10")


@dataclass
class PdFleet:
    prefill: list[Process]
    decode: list[Process]
    mixed: list[Process]
    frontend: Process
    tmp: Path

    @property
    def base_url(self) -> str:
        return self.frontend.url + "/v1"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=60)

    def ids(self, procs: list[Process]) -> list[str]:
        return [str(httpx.get(p.url + "/infera/worker").json()["instance_id"]) for p in procs]

    def stop(self) -> None:
        self.frontend.stop()
        for w in self.prefill + self.decode + self.mixed:
            w.stop()


def make_pd_fleet(tmp: Path, tokenizer: Path, connector: str, *, prefill: int = 2, decode: int = 2, mixed: int = 0,
                  frontend_args: tuple[str, ...] = (), engine: str = "mock") -> PdFleet:
    procs: list[Process] = []
    try:
        def start(role: str) -> Process:
            args = (*PD_ARGS, "--role", role, "--connector", connector, "--engine-name", engine)
            proc = start_mock(tmp, model_path=tokenizer, model=MODEL, args=args if role != "mixed" else PD_ARGS)
            procs.append(proc)
            return proc

        p = [start("prefill") for _ in range(prefill)]
        d = [start("decode") for _ in range(decode)]
        m = [start("mixed") for _ in range(mixed)]
        frontend = start_frontend(tmp, procs, tokenizer=tokenizer, args=frontend_args)
    except Exception:
        for proc in procs:
            proc.stop()
        raise
    return PdFleet(p, d, m, frontend, tmp)


@pytest.fixture(scope="module", params=["push", "pull"])
def pd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
       qwen_tokenizer_dir: Path) -> Iterator[PdFleet]:
    f = make_pd_fleet(tmp_path_factory.mktemp(f"pd-{request.param}"), qwen_tokenizer_dir, request.param)
    yield f
    f.stop()


def chat(f: PdFleet, messages: list[dict[str, str]], headers: dict[str, str] | None = None,
         max_tokens: int = 12) -> tuple[str, str, int, int]:
    """One chat turn: (decode worker, prefill worker, completion tokens, cached prompt tokens)."""
    raw = f.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                               max_tokens=max_tokens, extra_headers=headers or {})
    reply = raw.parse()
    assert reply.usage is not None
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    details = reply.usage.prompt_tokens_details
    return (raw.headers["x-infera-worker"], raw.headers.get("x-infera-prefill-worker", ""),
            reply.usage.completion_tokens, (details.cached_tokens or 0) if details else 0)


def test_chat_and_completions_stream_and_not_through_a_pair(pd: PdFleet) -> None:
    prefill_ids, decode_ids = set(pd.ids(pd.prefill)), set(pd.ids(pd.decode))
    messages = [{"role": "system", "content": system_prompt(1)}, {"role": "user", "content": "hello"}]
    decode, prefill, tokens, cached = chat(pd, messages)
    assert decode in decode_ids and prefill in prefill_ids
    assert tokens == 12  # the decode worker writes the whole answer, not the prefill's one token
    assert cached > 300  # the prompt's KV came from the prefill worker (vLLM counts it as cached)

    c = pd.client()
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream me"}], max_tokens=10, stream=True) if ch.choices)
    assert text
    done = c.completions.create(model=MODEL, prompt="Once upon a time " * 40, max_tokens=7)
    assert done.usage is not None and done.usage.completion_tokens == 7
    pieces = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt="Once upon a time " * 40,
                                                                   max_tokens=7, stream=True) if ch.choices]
    assert "".join(pieces) == done.choices[0].text  # deterministic output, whichever pair served it

    # both workers of the pair hold the prompt's KV and said so in their events
    def indexed() -> dict[str, int]:
        return {w["instance_id"]: w["kv_blocks_indexed"] for w in httpx.get(pd.base_url + "/workers").json()["data"]}

    wait_until(lambda: indexed()[prefill] > 15 and indexed()[decode] > 15, 20, "both legs' blocks indexed")
    wait_until(lambda: in_flight_total(pd.frontend.url) == 0, 20, "every load ticket released")


def test_a_conversation_returns_to_the_prefill_worker_holding_its_prefix(pd: PdFleet) -> None:
    messages = [{"role": "system", "content": system_prompt(2)}, {"role": "user", "content": "first"}]
    _, first, _, _ = chat(pd, messages)
    wait_indexed(pd.frontend)  # KV events reach the router
    messages.append({"role": "user", "content": "second"})
    _, second, _, _ = chat(pd, messages)
    assert second == first


def test_direct_mode_headers_name_the_decode_and_the_prefill_worker(pd: PdFleet) -> None:
    direct = start_frontend(pd.tmp, pd.prefill + pd.decode, policy="round-robin", args=("--router-mode", "direct"))
    try:
        f = PdFleet(pd.prefill, pd.decode, [], direct, pd.tmp)
        prefill_ids, decode_ids = pd.ids(pd.prefill), pd.ids(pd.decode)
        for p in prefill_ids:
            for d in decode_ids:
                got = chat(f, [{"role": "user", "content": "hi"}],
                           {"x-worker-instance-id": d, "x-prefill-instance-id": p})
                assert got[:2] == (d, p)
        only_decode = chat(f, [{"role": "user", "content": "hi"}], {"x-worker-instance-id": decode_ids[1]})
        assert only_decode[0] == decode_ids[1] and only_decode[1] in prefill_ids
        only_prefill = chat(f, [{"role": "user", "content": "hi"}], {"x-prefill-instance-id": prefill_ids[1]})
        assert only_prefill[1] == prefill_ids[1] and only_prefill[0] in decode_ids
        with pytest.raises(openai.BadRequestError, match="prefill worker"):
            chat(f, [{"role": "user", "content": "hi"}], {"x-worker-instance-id": prefill_ids[0]})
        with pytest.raises(openai.APIStatusError) as exc:
            chat(f, [{"role": "user", "content": "hi"}], {"x-prefill-instance-id": "nobody"})
        assert exc.value.status_code == 503
    finally:
        direct.stop()


def test_client_disconnect_releases_both_legs(pd: PdFleet) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me everything"}], "max_tokens": 5000,
            "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", pd.base_url + "/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)
        decode = resp.headers["x-infera-worker"]
        assert in_flight_total(pd.frontend.url) >= 1
    engine = next(p.url for p, wid in zip(pd.decode, pd.ids(pd.decode), strict=True) if wid == decode)
    wait_until(lambda: metric(scrape(engine), "vllm:num_requests_running") == 0, 20, "the engine idle")
    wait_until(lambda: in_flight_total(pd.frontend.url) == 0, 20, "every load ticket released")


@pytest.mark.parametrize("connector", ["push", "pull"])
def test_failures_retry_the_leg_that_failed_then_end_cleanly(connector: str, tmp_path: Path,
                                                             qwen_tokenizer_dir: Path) -> None:
    # A slow health poll, so the router still believes in the dead workers when requests come.
    f = make_pd_fleet(tmp_path, qwen_tokenizer_dir, connector, frontend_args=("--worker-poll-interval", "60"))
    try:
        by_id = dict(zip(f.ids(f.prefill + f.decode), f.prefill + f.decode, strict=True))
        messages = [{"role": "system", "content": system_prompt(3)}, {"role": "user", "content": "hello"}]
        _, prefill, _, _ = chat(f, messages)
        wait_indexed(f.frontend)

        # the prefill worker holding the prefix dies: another prefill worker computes the prompt
        by_id[prefill].kill()
        messages.append({"role": "user", "content": "again"})
        decode2, prefill2, tokens, _ = chat(f, messages)
        assert prefill2 != prefill and tokens == 12
        assert metric(scrape(f.frontend.url), "infera_request_retries_total") >= 1

        # the decode worker dies: another decode worker, with a fresh prefill on the live one
        by_id[decode2].kill()
        messages.append({"role": "user", "content": "and again"})
        decode3, prefill3, tokens, _ = chat(f, messages)
        assert decode3 != decode2 and prefill3 == prefill2 and tokens == 12
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")

        # after the first byte: an error event and a clean close, and both legs released
        stream = f.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long"}],
                                                    max_tokens=3000, stream=True)
        got = 0
        started = time.monotonic()
        with pytest.raises(openai.APIError):
            for _ in stream:
                got += 1
                if got == 3:
                    by_id[decode3].kill()
        assert got >= 3 and time.monotonic() - started < 30
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")
    finally:
        f.stop()


def test_fallback_to_mixed_when_a_pool_is_empty_and_503_with_neither(tmp_path: Path,
                                                                      qwen_tokenizer_dir: Path) -> None:
    f = make_pd_fleet(tmp_path, qwen_tokenizer_dir, "pull", prefill=1, decode=0, mixed=1)
    try:
        mixed = f.ids(f.mixed)[0]
        decode, prefill, tokens, _ = chat(f, [{"role": "user", "content": "no decode workers"}])
        assert (decode, prefill, tokens) == (mixed, "", 12)
        f.mixed[0].stop()
        wait_until(lambda: httpx.get(f.frontend.url + "/health").json()["workers"] == 1, 20,
                   "the frontend down to one worker")
        with pytest.raises(openai.APIStatusError) as exc:
            chat(f, [{"role": "user", "content": "nobody can serve this"}])
        assert exc.value.status_code == 503
        assert "prefill+decode pair" in exc.value.message and "1 prefill and 0 decode" in exc.value.message
    finally:
        f.stop()


def test_atom_pairs_take_completions_and_refuse_chat(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_pd_fleet(tmp_path, qwen_tokenizer_dir, "pull", prefill=1, decode=1, engine="atom")
    try:
        c = f.client()
        raw = c.completions.with_raw_response.create(model=MODEL, prompt="ATOM " * 50, max_tokens=5)
        assert raw.parse().usage.completion_tokens == 5  # type: ignore[union-attr]
        assert raw.headers["x-infera-prefill-worker"] == f.ids(f.prefill)[0]
        with pytest.raises(openai.BadRequestError, match="/v1/completions"):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert in_flight_total(f.frontend.url) == 0
    finally:
        f.stop()

"""The router in-process: a static fleet, a scripted transport, no processes (the fast tier)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import BlockStored, EventBatch
from infera.router.errors import BadDirectHeaders, NotServable, NoWorkers, UnknownWorker, UpstreamFailed
from infera.router.router import Router, RouterOptions
from tests.fakes import MODEL, FakeEvents, FakeFleet, FakeTransport, chat_request, completion_request, worker


def make(*workers: object, script: dict[str, object] | None = None, mode: str = "auto", policy: str = "round-robin",
         renderer: PromptRenderer | None = None, events: FakeEvents | None = None, first_byte_timeout: float = 600.0,
         **options: object) -> tuple[Router, FakeFleet, FakeTransport]:
    fleet = FakeFleet(*workers)  # type: ignore[arg-type]
    transport = FakeTransport(script, first_byte_timeout=first_byte_timeout)
    router = Router(fleet, transport, events, renderer, RouterOptions(mode=mode, policy=policy, **options),  # type: ignore[arg-type]
                    rng=random.Random(7))
    return router, fleet, transport


async def drain(router: Router, req: object) -> tuple[str, str | None, bytes]:
    routed = await router.dispatch(req, {})  # type: ignore[arg-type]
    body = b"".join([c async for c in routed.chunks()])
    return routed.worker_id, routed.prefill_worker_id, body


def idle(router: Router, transport: FakeTransport) -> bool:
    """Nothing in flight anywhere: every ticket ended and every upstream response closed."""
    return all(w.in_flight == 0 for w in router.view.workers()) and transport.open == 0


PAIR = (worker("p1", "prefill", connector="pull"), worker("p2", "prefill", connector="pull"),
        worker("d1", "decode", connector="pull"), worker("d2", "decode", connector="pull"))


# ---- direct mode ---------------------------------------------------------------------------

async def test_direct_headers_name_a_mixed_worker_or_both_workers_of_a_pair() -> None:
    router, _, transport = make(worker("m1"), worker("m2"), *PAIR, mode="direct")
    assert (await drain(router, chat_request(worker="m2")))[:2] == ("m2", None)
    assert (await drain(router, chat_request(worker="d2", prefill="p1")))[:2] == ("d2", "p1")
    decode_only = await drain(router, chat_request(worker="d1"))
    assert decode_only[0] == "d1" and decode_only[1] in ("p1", "p2")
    prefill_only = await drain(router, chat_request(prefill="p2"))
    assert prefill_only[1] == "p2" and prefill_only[0] in ("d1", "d2")
    assert idle(router, transport)


@pytest.mark.parametrize(("hint", "prefill", "error", "words"), [
    ("nobody", None, UnknownWorker, "not in the fleet"),
    (None, "nobody", UnknownWorker, "not in the fleet"),
    ("p1", None, BadDirectHeaders, "is a prefill worker"),
    (None, "d1", BadDirectHeaders, "not a prefill worker"),
    ("m1", "p1", BadDirectHeaders, "mixed worker and cannot take a prefill worker"),
    ("d1", "q1", BadDirectHeaders, "different connectors"),
    ("other", None, BadDirectHeaders, "serves model 'x', not 'm'"),
])
async def test_direct_headers_that_cannot_be_served_say_why(hint: str | None, prefill: str | None,
                                                             error: type[Exception], words: str) -> None:
    router, _, transport = make(worker("m1"), *PAIR, worker("q1", "prefill", connector="push"),
                                worker("other", model="x"), mode="direct")
    with pytest.raises(error, match=words):
        await router.dispatch(chat_request(worker=hint, prefill=prefill), {})
    assert transport.calls == [] and idle(router, transport)


async def test_direct_mode_without_headers_routes_as_auto() -> None:
    router, _, _ = make(worker("m1"), mode="direct")
    assert (await drain(router, chat_request()))[0] == "m1"


async def test_a_named_worker_that_fails_is_not_replaced() -> None:
    router, _, transport = make(worker("m1"), worker("m2"), script={"m1": "fail"}, mode="direct")
    with pytest.raises(UpstreamFailed) as exc:
        await router.dispatch(chat_request(worker="m1"), {})
    assert exc.value.status == 502 and transport.tried() == ["m1"]
    assert idle(router, transport)


# ---- retries, cooldown, 429 -------------------------------------------------------------------

async def until_tried(router: Router, transport: FakeTransport, wid: str) -> str:
    """Dispatch until the (random) tie-break has tried ``wid``; the worker that served the last one."""
    for _ in range(50):
        transport.calls.clear()
        served = (await drain(router, chat_request()))[0]
        if wid in transport.tried():
            return served
    raise AssertionError(f"{wid} never tried")


async def test_a_failed_worker_is_retried_elsewhere_and_cools_down() -> None:
    router, _, transport = make(worker("a"), worker("b"), script={"a": "fail"}, policy="least-load")
    assert await until_tried(router, transport, "a") == "b"
    assert transport.tried() == ["a", "b"]
    cooling = {w.record.instance_id: w.cooldown_seconds for w in router.view.workers()}
    assert cooling["a"] > 0 and cooling["b"] == 0
    assert router.view.stats().retries == 1
    transport.calls.clear()
    assert (await drain(router, chat_request()))[0] == "b"  # a is avoided while it cools down
    assert transport.tried() == ["b"]
    assert idle(router, transport)


async def test_a_busy_worker_429_is_tried_elsewhere_but_not_cooled_down() -> None:
    router, _, transport = make(worker("a"), worker("b"), script={"a": "busy"}, policy="least-load")
    assert await until_tried(router, transport, "a") == "b"
    assert transport.tried() == ["a", "b"]
    assert all(w.cooldown_seconds == 0 for w in router.view.workers())
    assert idle(router, transport)


async def test_when_every_worker_is_busy_the_client_sees_429() -> None:
    router, _, transport = make(worker("a"), worker("b"))
    transport.default = "busy"
    with pytest.raises(UpstreamFailed) as exc:
        await router.dispatch(chat_request(), {})
    assert exc.value.status == 429
    assert all(w.cooldown_seconds == 0 for w in router.view.workers())


async def test_retries_stop_at_max_retries_with_the_last_error() -> None:
    router, _, transport = make(worker("a"), worker("b"), worker("c"), max_retries=1)
    transport.default = "fail"
    with pytest.raises(UpstreamFailed, match="unreachable") as exc:
        await router.dispatch(chat_request(), {})
    assert exc.value.status == 502 and len(transport.calls) == 2
    assert idle(router, transport)


def tear_first_read(transport: Any, wid: str) -> None:
    """``transport``'s answers from ``wid`` fail at their first read with a plain OSError (not an UpstreamError)."""
    send = transport.send

    async def torn(w: Any, path: str, body: bytes, headers: Any, started: float | None = None) -> Any:
        upstream = await send(w, path, body, headers, started)
        if w.instance_id != wid:
            return upstream

        async def broken() -> AsyncIterator[bytes]:
            raise OSError("torn")
            yield b""

        upstream.body = broken()
        return upstream

    transport.send = torn

async def test_a_first_read_that_breaks_is_an_upstream_failure_before_the_first_byte() -> None:
    """A body whose first read raises something that is not an :class:`UpstreamError` (a torn connection seen as
    an OSError, a bug in a transport) fails its leg before the first byte, as an UpstreamError that names the worker
    and says so: retried elsewhere, the broken response closed, nothing left in flight."""
    router, _, transport = make(worker("a"), worker("b"), policy="least-load", max_retries=1)
    tear_first_read(transport, "a")
    assert await until_tried(router, transport, "a") == "b"
    assert transport.tried() == ["a", "b"] and router.view.stats().retries == 1
    assert idle(router, transport)
    router2, _, transport2 = make(worker("a"), policy="least-load", max_retries=0)
    tear_first_read(transport2, "a")
    with pytest.raises(UpstreamFailed, match="worker a failed before its first byte: torn") as exc:
        await router2.dispatch(chat_request(), {})
    assert exc.value.status == 502
    assert idle(router2, transport2)


async def test_no_worker_for_the_model_is_no_workers() -> None:
    router, _, _ = make(worker("a", model="other"))
    with pytest.raises(NoWorkers, match="no worker can serve model 'm'"):
        await router.dispatch(chat_request(), {})
    empty, _, _ = make()
    with pytest.raises(NoWorkers, match="no workers are available"):
        await empty.dispatch(chat_request(), {})


# ---- temperature -----------------------------------------------------------------------------

async def test_temperature_spreads_picks_over_costlier_workers() -> None:
    async def picks(temperature: float) -> set[str]:
        router, _, _ = make(worker("a"), worker("b"), policy="least-load", temperature=temperature)
        busy = await router.place(chat_request(max_tokens=4000))  # b or a now holds load
        loaded = busy.worker.instance_id
        chosen = set()
        for _ in range(40):
            placement = await router.place(chat_request())
            chosen.add(placement.worker.instance_id)
            placement.release()
        busy.release()
        return chosen | {"loaded:" + loaded}

    cold = await picks(0.0)
    assert len(cold) == 2  # always the idle one (plus the loaded marker)
    hot = await picks(1000.0)
    assert len(hot) == 3  # both workers chosen


# ---- prefill + decode --------------------------------------------------------------------------

@pytest.mark.parametrize("failing", ["p1", "d1"])
async def test_a_failed_leg_of_a_pair_is_retried_in_its_pool(failing: str) -> None:
    router, _, transport = make(*PAIR, script={failing: "fail"}, policy="least-load")
    for _ in range(50):
        transport.calls.clear()
        decode, prefill, body = await drain(router, completion_request())
        assert failing not in (decode, prefill) and body
        if failing in transport.tried():
            break
    assert failing in transport.tried()
    assert idle(router, transport)


async def test_a_pair_fails_when_every_prefill_worker_fails() -> None:
    router, _, transport = make(*PAIR, script={"p1": "fail", "p2": "fail"}, max_retries=3)
    with pytest.raises(UpstreamFailed):
        await router.dispatch(completion_request(), {})
    assert idle(router, transport)


# ---- capabilities (ATOM) -------------------------------------------------------------------------

ATOM = (worker("ap", "prefill", engine="atom", connector="pull"), worker("ad", "decode", engine="atom",
                                                                         connector="pull"))


async def test_atom_chat_goes_to_a_mixed_worker_when_the_model_has_one() -> None:
    router, _, _ = make(*ATOM, worker("mixed"))
    assert (await drain(router, chat_request()))[:2] == ("mixed", None)
    assert (await drain(router, completion_request()))[:2] == ("ad", "ap")  # completions still disaggregate


async def test_atom_chat_is_refused_when_only_the_pair_serves_the_model() -> None:
    router, _, transport = make(*ATOM)
    with pytest.raises(NotServable, match="/v1/completions"):
        await router.dispatch(chat_request(), {})
    assert transport.calls == [] and idle(router, transport)
    direct, _, _ = make(*ATOM, worker("mixed"), mode="direct")
    with pytest.raises(NotServable):
        await direct.dispatch(chat_request(worker="ad"), {})


def test_records_without_the_capability_derive_it() -> None:
    assert worker("x", "prefill", engine="atom").serves_chat is False
    assert worker("x", "mixed", engine="atom").serves_chat is True
    assert worker("x", "prefill", engine="vllm").serves_chat is True
    assert worker("x", "prefill", engine="atom", serves_chat=True).serves_chat is True


# ---- load on every path ----------------------------------------------------------------------------

async def test_load_is_held_while_streaming_and_released_at_the_end() -> None:
    router, _, transport = make(worker("a"))
    routed = await router.dispatch(chat_request(stream=True), {})
    assert router.view.workers()[0].in_flight == 1
    assert b"[DONE]" in b"".join([c async for c in routed.chunks()])
    assert idle(router, transport)


async def test_load_is_released_after_a_first_byte_timeout() -> None:
    router, _, transport = make(worker("a"), worker("b"), script={"a": "silent", "b": "silent"},
                                first_byte_timeout=0.02)
    with pytest.raises(UpstreamFailed, match="no first byte") as exc:
        await router.dispatch(chat_request(), {})
    assert exc.value.status == 504
    assert idle(router, transport)


@pytest.mark.parametrize("fleet", ["mixed", "pair"])
async def test_load_is_released_when_the_dispatch_is_cancelled(fleet: str) -> None:
    workers = (worker("a"),) if fleet == "mixed" else PAIR
    router, _, transport = make(*workers, policy="least-load")
    transport.default = "hang"
    task = asyncio.ensure_future(router.dispatch(completion_request(), {}))
    await transport.sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert idle(router, transport)


async def test_an_engine_error_status_is_relayed_and_released() -> None:
    router, _, transport = make(worker("a"), script={"a": (400, b'{"error": {"message": "bad"}}')})
    routed = await router.dispatch(chat_request(), {})
    assert routed.status == 400
    assert b"bad" in b"".join([c async for c in routed.chunks()])
    assert idle(router, transport)


# ---- placement ------------------------------------------------------------------------------------------

async def test_a_placement_holds_load_until_released_once() -> None:
    router, _, transport = make(worker("a"), worker("b"), policy="least-load")
    placement = await router.place(chat_request())
    assert placement.kind == "mixed" and placement.prefill is None
    held = {w.record.instance_id: w.in_flight for w in router.view.workers()}
    assert held[placement.worker.instance_id] == 1
    placement.answered()
    placement.release()
    placement.release()
    assert idle(router, transport) and transport.calls == []
    failing = await router.place(chat_request())
    failing.failed(failing.worker.instance_id, retryable=False)
    assert router.view.workers()[0 if failing.worker.instance_id == "a" else 1].cooldown_seconds > 0
    assert idle(router, transport)


async def test_a_placement_of_a_pair_names_both_workers() -> None:
    router, _, _ = make(*PAIR, policy="least-load")
    placement = await router.place(completion_request())
    assert placement.kind == "pd" and placement.connector == "pull"
    assert set(placement.workers()) == {"prefill", "decode"}
    placement.release()


# ---- kv-aware, events, and leaving -----------------------------------------------------------------------

@pytest.fixture
def renderer(tiny_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_dir(str(tiny_tokenizer_dir))


async def test_preview_records_nothing(renderer: PromptRenderer) -> None:
    router, _, _ = make(worker("a"), worker("b"), policy="kv-aware", renderer=renderer)
    before = router.view.stats().decisions.copy()
    tokens = router.tokens("chat", chat_request("a long prompt " * 20).payload)
    picked = router.preview(MODEL, tokens)
    assert picked is not None and picked.instance_id == "a"  # ties: the lowest id
    assert router.view.stats().decisions == before
    assert all(w.in_flight == 0 and w.kv_blocks_indexed == 0 for w in router.view.workers())


async def test_every_piece_of_worker_state_goes_when_it_leaves(renderer: PromptRenderer) -> None:
    events = FakeEvents()
    router, fleet, transport = make(worker("a", events=True), worker("b", events=True), policy="kv-aware",
                                    renderer=renderer, events=events, events_stale_seconds=0.0)
    await router.start()
    assert events.watched == {"a", "b"}
    transport.script["a"] = "fail"
    held = await router.place(chat_request("keep me busy " * 30))  # load on someone
    await drain(router, chat_request("the prompt " * 30))  # a fails (cooldown), b serves (prediction)
    events.sink("a", EventBatch(ts=0.0, events=[BlockStored(block_hashes=[1], parent_block_hash=None,
                                                            token_ids=list(range(16)), block_size=16)]))
    events.on_gap("b", 2)
    for wid in ("a", "b"):
        fleet.remove(wid)
    held.release()
    assert events.watched == set()
    assert router.view.workers() == []
    stats = router.view.stats()
    assert not stats.kv_batches and not stats.kv_gaps
    for wid in ("a", "b"):
        assert not router._load.holds(wid)
        assert not router._candidates.holds(wid)
        assert not router._feed.blind(wid) or router.view.worker(wid) is None
        assert wid not in router._feed.index.workers()
        assert not router._feed.holds(wid)
    await router.stop()


async def test_a_silent_worker_is_logged_by_the_ticker_never_by_a_query(renderer: PromptRenderer,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infera.kv.feed")
    router, _, _ = make(worker("a", events=True), policy="kv-aware", renderer=renderer, events=FakeEvents(),
                        events_stale_seconds=0.05)
    await drain(router, chat_request("an uncached prompt " * 30))
    deadline = time.monotonic() + 5
    while not router.view.workers()[0].kv_events_stale:  # the query (a metrics scrape) sees it...
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert "no KV events" not in caplog.text  # ...and logs nothing
    await router.start()  # the feed's ticker notices the silence without another decision
    while "no KV events" not in caplog.text:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await router.stop()


def test_the_models_served_follow_the_fleet() -> None:
    router, fleet, _ = make(worker("a"))
    assert router.view.models() == [MODEL]
    router.view.models().append("not served")  # a caller's copy: the view's answer stays
    assert router.view.models() == [MODEL]
    fleet.add(worker("b", model="another"))
    assert router.view.models() == ["another", MODEL]
    fleet.remove("a")
    assert router.view.models() == ["another"]


def test_whether_a_model_is_served_follows_the_fleet() -> None:
    router, fleet, _ = make(worker("a"))
    assert router.view.serves(MODEL) and not router.view.serves("another")
    fleet.add(worker("b", model="another"))
    assert router.view.serves(MODEL) and router.view.serves("another")
    fleet.remove("a")
    assert not router.view.serves(MODEL) and router.view.serves("another")
    fleet.remove("b")
    assert not router.view.serves("another")


@pytest.mark.parametrize("size", [1, 3, 64, 65])  # 65: past the cached rotations
async def test_round_robin_takes_every_worker_in_turn_as_the_fleet_changes(size: int) -> None:
    ids = [f"w{i:03d}" for i in range(size)]
    router, fleet, transport = make(*(worker(i) for i in ids))
    served = [(await drain(router, chat_request()))[0] for _ in range(3 * size)]
    assert served == ids * 3  # in id order, each once per turn
    fleet.add(worker("w999"))  # a bigger pool: still every worker once per turn
    turn = [(await drain(router, chat_request()))[0] for _ in range(size + 1)]
    assert sorted(turn) == [*ids, "w999"]
    fleet.remove("w999")
    turn = [(await drain(router, chat_request()))[0] for _ in range(size)]
    assert sorted(turn) == ids
    assert idle(router, transport)

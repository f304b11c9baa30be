"""A KV-event batch applied from its msgpack payload in one C call (``PrefixIndex.apply_payload``, offered first by
``deliver``) against ``decode_batch`` + ``PrefixIndex.apply``: on hypothesis-built batches of every form the decoder
reads (vLLM 0.32's maps, the array forms, other tiers, cleared caches, malformed bytes), the index's tables, its
remembered walks' pending rows, its counters and the gaps reported are the same, batch after batch."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.kv.native import load
from infera.protocols.kv_events import BlockStored, EventBatch, decode_batch, encode_batch
from infera.transport.delivery import deliver
from tests.fakes import FakeEvents, FakeFleet
from tests.kv.test_packed import _FORMS, _pack

native = load()
pytestmark = pytest.mark.skipif(native is None or not hasattr(native, "apply_payload"),
                                reason="the C extension infera.kv._native is not built (with apply_payload)")

BS = 4
PREFIX = 66  # blocks of a prompt both workers hold: more than RUN_MIN_BLOCKS, so a query remembers its walk
_MISSING = object()
_TOKENS = list(range(PREFIX * BS))
_HASHES = {"a": list(range(1000, 1000 + PREFIX)), "b": list(range(5000, 5000 + PREFIX))}
# engine hashes the batches use: the prefix's, a few of their own, and ones no worker holds
_POOL = _HASHES["a"][-6:] + _HASHES["b"][-6:] + list(range(9000, 9012)) + [2**64 - 1, 0]


def _state(ix: PrefixIndex) -> Any:
    workers = {
        wid: (list(w.blocks.items()), w.media, w.extra, w.lower, list(w.predicted.items()), w.orphan_blocks,
              w.last_event_ts, w.last_applied_at)
        for wid, w in ix._workers.items()
    }
    pending = set(ix._rows._pending) if ix._rows is not None else None
    return (workers, list(ix._holders.items()), ix._shared, ix._predicted, ix._watched, pending,
            ix.counters.as_dict())


def _start(block_size: int | None) -> PrefixIndex:
    ix = PrefixIndex(block_size)
    for wid in ("a", "b"):
        ix.apply(wid, EventBatch(0.0, [BlockStored(_HASHES[wid], None, _TOKENS, BS)]), now=1.0)
    assert ix.overlaps(list(ix._holders.keys())[:PREFIX]) == {"a": PREFIX, "b": PREFIX}
    return ix


hashes = st.lists(st.sampled_from(_POOL) | st.integers(0, 2**64 - 1), min_size=0, max_size=5)
odd_hash = st.sampled_from([-1, b"\x01\x02", "x"])
token = st.integers(0, 40) | st.sampled_from([0, 127, 128, 255, 65535, 2**32 - 1])
odd_token = st.sampled_from([-1, 2**32, 1.5, None, "t"])
medium = st.sampled_from(["GPU", "GPU", "GPU", "CPU", None, _MISSING, 3])
optional = st.fixed_dictionaries({}, optional={
    "extra_keys": st.none() | st.lists(st.none() | st.integers(-5, 5) | st.text(max_size=3)
                                       | st.lists(st.integers(0, 9), max_size=2) | st.binary(max_size=2), max_size=3)
                  | st.just({"k": 1}),
    "group_idx": st.none() | st.integers(-2, 3) | st.just("g"),
    "kv_cache_spec_kind": st.none() | st.just("full_attention") | st.just("é"),
    "lora_id": st.none() | st.integers(0, 3),
    "lora_name": st.none() | st.just("l"),
    "zz_unknown": st.integers(0, 3),
})


@st.composite
def stored(draw: st.DrawFn, clean: bool) -> Any:
    """A stored event; ``clean``: as vLLM 0.32 sends it (the form the C path takes, unless the index declines)."""
    hs = draw(hashes)
    n = len(hs)
    if not clean and draw(st.integers(0, 9)) == 0:
        hs = [*hs, draw(odd_hash)]
    if draw(st.integers(0, 3)) == 0:  # the shared prompt's first blocks again: a remembered walk's masks change
        tokens, parent = _TOKENS[: max(0, n * BS - draw(st.sampled_from([0, 0, 1, 5])))], None
    else:
        tokens = draw(st.lists(token, min_size=max(0, n * BS - 5), max_size=n * BS + 3))
        parent = draw(st.none() | st.sampled_from(_POOL + _HASHES["a"][:3]) | st.integers(0, 2**64 - 1))
    if not clean and draw(st.integers(0, 9)) == 0 and tokens:
        tokens = [*tokens]
        tokens[draw(st.integers(0, len(tokens) - 1))] = draw(odd_token)
    ev: dict[str, Any] = {"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent,
                          "token_ids": tokens, "block_size": draw(st.sampled_from([BS, BS, BS, 3])),
                          "lora_id": None, "medium": "GPU" if clean else draw(medium), "lora_name": None}
    if not clean:
        ev["block_size"] = draw(st.sampled_from([BS, 3, 0]))
        ev.update(draw(optional))
    elif draw(st.booleans()):
        ev.update({"extra_keys": [None] * n, "group_idx": 0, "kv_cache_spec_kind": "full_attention"})
    return _form(draw, ev, ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                            "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"), clean)


@st.composite
def removed(draw: st.DrawFn, clean: bool) -> Any:
    hs = draw(st.lists(st.sampled_from(_POOL), min_size=0, max_size=5))
    ev: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": hs, "medium": "GPU" if clean else draw(medium)}
    if draw(st.booleans()):
        ev["group_idx"] = draw(st.none() | st.integers(0, 3))
    return _form(draw, ev, ("block_hashes", "medium", "group_idx"), clean)


def _form(draw: st.DrawFn, ev: dict[str, Any], order: tuple[str, ...], clean: bool) -> Any:
    """The event as a map (vLLM 0.32), as one with its tag last, or as SGLang's tagged array."""
    ev = {k: v for k, v in ev.items() if v is not _MISSING}
    form = "map" if clean else draw(st.sampled_from(["map"] * 3 + ["tag-last", "array"]))
    if form == "array":
        return [ev["type"], *(ev[k] for k in order if k in ev)]
    if form == "tag-last":
        tag = ev.pop("type")
        ev["type"] = tag
    return ev


def event(clean: bool) -> st.SearchStrategy[Any]:
    if clean:
        return stored(True) | removed(True)
    return stored(False) | removed(False) | st.just({"type": "AllBlocksCleared"}) | st.just({"type": "Other", "x": 1})


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Half of them as vLLM 0.32 sends them; the others any form the decoder reads, or bytes it does not."""
    clean = draw(st.booleans())
    events = draw(st.lists(event(clean), min_size=0, max_size=5))
    ts = draw(st.floats(0, 1e9) | st.integers(-5, 2**40) | st.just(2**64 - 1))
    batch: list[Any] = [ts, events]
    if draw(st.booleans()):
        batch.append(draw(st.none() | st.integers(0, 3) | st.just([1, "x"])))
    packed: bytes = msgpack.packb(batch, use_bin_type=True, use_single_float=draw(st.booleans()))
    mangle = 9 if clean else draw(st.integers(0, 5))
    if mangle == 0 and packed:
        packed = packed[: draw(st.integers(0, len(packed) - 1))]
    elif mangle == 1:
        packed += b"\xc0"
    elif mangle == 2 and packed:
        at = draw(st.integers(0, len(packed) - 1))
        packed = packed[:at] + bytes([draw(st.integers(0, 255))]) + packed[at + 1:]
    return packed


class _Old:
    """The index fed as before: ``deliver`` decodes, ``apply`` applies; a gap drops the worker (as IndexFeed)."""

    def __init__(self, ix: PrefixIndex, raw: bool) -> None:
        self.ix, self.raw = ix, raw
        self.gaps: list[tuple[str, int]] = []
        self.raised: list[str] = []  # what got out of deliver (the general decoder's rare TypeError, say)

    def sink(self, wid: str, batch: EventBatch) -> None:
        self.ix.apply(wid, batch, now=1.0)

    def payload(self, wid: str, payload: bytes) -> bool:
        return self.ix.apply_payload(wid, payload, now=1.0)

    def gap(self, wid: str, lost: int) -> None:
        self.gaps.append((wid, lost))
        self.ix.remove_worker(wid)

    def deliver(self, wid: str, payload: bytes) -> None:
        try:
            deliver(wid, payload, self.sink, self.gap, self.payload if self.raw else None)
        except Exception as exc:
            self.raised.append(type(exc).__name__)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "a", "b", "c"]), payloads(),
                          st.lists(st.sampled_from(range(PREFIX)), max_size=3)), min_size=1, max_size=12),
       st.sampled_from([None, BS]))
def test_a_payload_leaves_the_index_as_decode_and_apply_do(batches: list[tuple[str, bytes, list[int]]],
                                                           block_size: int | None) -> None:
    logging.disable(logging.CRITICAL)  # the undecodable and unappliable batches' lines, hundreds of them
    try:
        old, new = _Old(_start(block_size), raw=False), _Old(_start(block_size), raw=True)
        assert _state(old.ix) == _state(new.ix)
        for wid, payload, guesses in batches:
            for feed in (old, new):  # a prediction of some prefix blocks, so a store or removal drops it
                routed = [h for i, h in enumerate(feed.ix._holders.keys()) if i in guesses]
                feed.ix.predict(wid, routed, ttl=10.0, now=0.0)
            old.deliver(wid, payload)
            new.deliver(wid, payload)
            assert _state(new.ix) == _state(old.ix), payload
            assert (new.gaps, new.raised) == (old.gaps, old.raised)
        walk = list(old.ix._holders.keys())[:PREFIX]
        assert new.ix.overlaps(walk) == old.ix.overlaps(walk)  # the remembered walks, settled from pending rows
    finally:
        logging.disable(logging.NOTSET)


def test_vllm_batches_are_taken_whole_and_others_declined_unchanged() -> None:
    ix = _start(None)
    before = _state(ix)
    stored_ev = BlockStored([77, 78], _HASHES["a"][-1], list(range(2 * BS)), BS, medium="GPU")
    vllm = encode_batch(EventBatch(2.5, [stored_ev]))
    assert ix.apply_payload("a", vllm, now=3.0)
    assert ix.counters.block_stored == 3 and ix._workers["a"].last_event_ts == 2.5
    assert ix.block_count("a") == PREFIX + 2
    # declined, nothing changed: a worker the index does not know, another tier, a cleared cache, bad bytes
    ix2 = _start(None)
    before = _state(ix2)
    for wid, payload in [
        ("c", vllm),
        ("a", encode_batch(EventBatch(1.0, [BlockStored([77], None, list(range(BS)), BS, medium="CPU")]))),
        ("a", msgpack.packb([1.0, [{"type": "AllBlocksCleared"}]])),
        ("a", vllm[:-1]),
        ("a", vllm + b"\x00"),
        ("a", b""),
    ]:
        assert not ix2.apply_payload(wid, payload)
        assert _state(ix2) == before


def test_the_feed_binds_the_payload_path_on_the_c_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = FakeFleet()
    events = FakeEvents()
    feed = IndexFeed(fleet, events, PrefixIndex())  # type: ignore[arg-type]
    assert events.raw == feed.on_payload
    assert not feed.on_payload("w", encode_batch(EventBatch(1.0, [])))  # a new worker: decoded and applied
    deliver("w", encode_batch(EventBatch(1.0, [])), events.sink, events.on_gap, events.raw)
    assert feed.batches["w"] == 1
    payload = encode_batch(EventBatch(2.0, [BlockStored([1], None, list(range(16)), 16, medium="GPU")]))
    assert feed.on_payload("w", payload)
    assert feed.batches["w"] == 2 and feed.index.block_count("w") == 1
    pure = FakeEvents()
    IndexFeed(fleet, pure, PrefixIndex(native=False))  # type: ignore[arg-type]
    assert pure.raw is None


def test_a_failure_inside_the_payload_path_counts_a_gap(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    gaps: list[tuple[str, int]] = []

    def broken(wid: str, payload: bytes) -> bool:
        raise RuntimeError("boom")

    def sink(wid: str, batch: EventBatch) -> None:
        raise AssertionError("not decoded after a raw sink failed")

    deliver("w", encode_batch(EventBatch(1.0, [])), sink, lambda w, n: gaps.append((w, n)), broken)
    assert gaps == [("w", 1)]
    assert "could not be applied" in caplog.text
    got: list[EventBatch] = []
    deliver("w", b"\xc1", lambda w, b: got.append(b), lambda w, n: gaps.append((w, n)), lambda w, p: False)
    assert got == [] and gaps == [("w", 1)] and "undecodable" in caplog.text
    assert decode_batch(encode_batch(EventBatch(1.0, []))).events == []


@settings(max_examples=200, deadline=None)
@given(st.lists(token | st.integers(0, 2**32 - 1), min_size=0, max_size=3 * BS + 2),
       st.lists(st.sampled_from(sorted(_FORMS)), min_size=1, max_size=4), st.sampled_from(["fix", "16", "32"]))
def test_token_ids_in_every_msgpack_int_width(tokens: list[int], forms: list[str], header: str) -> None:
    """What other encoders write (wider ints, signed forms, wider array headers): hashed as the decoder reads them."""
    ev = {"type": "BlockStored", "block_hashes": [7, 8, 9], "parent_block_hash": None, "block_size": BS,
          "lora_id": None, "medium": "GPU", "lora_name": None, "token_ids": []}
    payload = msgpack.packb([1.0, [ev]])
    assert payload.endswith(b"\x90")  # token_ids, last: splice the array in
    payload = payload[:-1] + _pack(tokens, forms, header)
    old, new = _start(None), _start(None)
    old.apply("a", decode_batch(payload), now=1.0)
    assert new.apply_payload("a", payload, now=1.0)
    assert _state(new) == _state(old)


class _Stale:
    """The C module as an extension built before apply_payload left it."""

    def __getattr__(self, name: str) -> Any:
        if name == "apply_payload":
            raise AttributeError(name)
        return getattr(native, name)


def test_an_extension_without_apply_payload_keeps_decode_and_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("infera.kv.index.choose", lambda _native: _Stale())
    ix = PrefixIndex()
    assert not ix.takes_payloads
    events = FakeEvents()
    feed = IndexFeed(FakeFleet(), events, ix)  # type: ignore[arg-type]
    assert events.raw is None
    payload = encode_batch(EventBatch(1.0, [BlockStored([1], None, list(range(16)), 16, medium="GPU")]))
    deliver("w", payload, events.sink, events.on_gap, events.raw)
    deliver("w", payload, events.sink, events.on_gap, events.raw)
    assert not ix.apply_payload("w", payload)
    assert feed.batches["w"] == 2 and ix.block_count("w") == 1

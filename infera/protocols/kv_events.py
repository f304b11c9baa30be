"""KV-cache events in vLLM's wire format (decode and encode).

An engine publishes ZMQ multipart messages ``[topic, seq, payload]``: ``seq`` is an
8-byte big-endian unsigned counter per publisher, ``payload`` one msgpack
``EventBatch`` = ``[ts, events, data_parallel_rank]``. vLLM >= 0.32 encodes each
event as a map keyed by field name (tag in ``"type"``); older vLLM and SGLang encode
it as an array with the tag first, and SGLang leaves trailing fields out. The
decoder accepts all of these; the encoder writes what vLLM 0.32 writes, byte for byte.

Block hashes are opaque unsigned 64-bit ids chosen by the engine.

Decoding is on the router's hot path (one ``BlockRemoved`` per evicted block): a typed msgspec
decoder reads vLLM 0.32's map form straight into the event structs, in C; anything it does not
accept (array forms, signed or byte-string hashes, unknown event types, missing fields) goes
through the general decoder, which gives the same result the slow way. On the fast path a stored
event's token ids stay msgpack bytes (:class:`TokenIds`): the index hashes them from those bytes, and
builds no int object per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, overload

import msgpack
import msgspec

SEQ_BYTES = 8
REPLAY_END_SEQ = 2**64 - 1  # the replay socket's end marker: seq -1 as signed 64-bit


class KvEventDecodeError(ValueError):
    """A payload is not a KV-event batch this decoder understands."""


class _Unsaid(str):
    """The default medium of an event built in code; a decoded event that left ``medium`` out has None."""

    __slots__ = ()


_GPU = _Unsaid("GPU")
# Field constraints apply to decoding only (the general decoder's rules, checked in C):
# unsigned 64-bit hashes, a positive block size.
_U64 = Annotated[int, msgspec.Meta(ge=0)]


class TokenIds(Sequence[int]):
    """A decoded ``BlockStored``'s token ids as they came on the wire: one msgpack array, decoded on first use.

    ``packed``: the array's msgpack bytes (a bytes-like object), which the index hashes in place
    (``infera.kv._native.chain_hashes_packed``). Read as a sequence it is the list the general decoder
    would give (``==`` a list holding the same ids); bytes that are not one msgpack array raise
    :class:`KvEventDecodeError` on first use.
    """

    __slots__ = ("_ids", "packed")

    def __init__(self, packed: Any) -> None:
        self.packed = packed
        self._ids: list[Any] | None = None

    def ids(self) -> list[Any]:
        """The token ids as a list (decoded once; the list is shared: do not change it)."""
        if self._ids is None:
            try:
                ids = msgspec.msgpack.decode(self.packed)
            except msgspec.DecodeError as exc:
                raise KvEventDecodeError(f"token_ids are not msgpack: {exc}") from exc
            if not isinstance(ids, list):
                raise KvEventDecodeError(f"token_ids is {type(ids).__name__}, expected an array")
            self._ids = ids
        return self._ids

    def __len__(self) -> int:
        return len(self.ids())

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self.ids()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.ids() == other.ids()
        if isinstance(other, list):
            return self.ids() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a list's equality, a list's (absent) hash

    def __repr__(self) -> str:
        return f"TokenIds({self.ids()!r})"


class BlockStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    block_hashes: list[_U64]
    parent_block_hash: _U64 | None
    # Tokens of all blocks in the event, concatenated: a list when built in code or by the general decoder,
    # TokenIds from the fast path.
    token_ids: Sequence[int]
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    lora_id: int | None = None
    medium: str | None = _GPU
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: list[_U64]
    medium: str | None = _GPU
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = 0


class _WireStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """``BlockStored`` as the fast path reads it: the same fields in the same order, the token ids left as
    msgpack bytes, a medium left out None."""

    block_hashes: list[_U64]
    parent_block_hash: _U64 | None
    token_ids: msgspec.Raw
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _WireBatch(msgspec.Struct, array_like=True, gc=False):
    """``[ts, events, dp_rank]`` with every event in vLLM 0.32's map form (the fast path)."""

    ts: float
    events: list[_WireStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: Any = None


_fast_decoder = msgspec.msgpack.Decoder(_WireBatch)
_astuple = msgspec.structs.astuple
_new_ids = object.__new__
_ARRAY_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])  # the first byte of a msgpack array


# Field order on the wire (vLLM's class field order). Fields with a default are written
# only when they differ from it (msgspec omit_defaults); required fields always.
_STORED_REQUIRED = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
)
_STORED_OPTIONAL = ("extra_keys", "group_idx", "kv_cache_spec_kind")
_REMOVED_REQUIRED = ("block_hashes", "medium")
_REMOVED_OPTIONAL = ("group_idx",)


ReplayStep = Literal["deliver", "skip", "done", "unreachable"]


def replay_step(seq: int, next_seq: int, start: int, stop: int | None) -> ReplayStep:
    """What to do with replayed batch ``seq`` while filling ``start <= seq < stop`` (open-ended
    when ``stop`` is None), everything before ``next_seq`` being applied already.

    ``deliver`` it; ``skip`` it (applied already, or past ``stop``); ``done``: the end marker,
    or a hole in the engine's buffer after some progress (the caller resumes at ``next_seq``);
    ``unreachable``: the buffer no longer reaches back to ``start`` (a start of 0 accepts
    whatever the buffer still holds).
    """
    if seq == REPLAY_END_SEQ:
        return "done"
    if seq < next_seq or (stop is not None and seq >= stop):
        return "skip"
    if seq > next_seq and next_seq != start:
        return "done"
    if seq > next_seq and start != 0:
        return "unreachable"
    return "deliver"


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def seq_from_bytes(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise KvEventDecodeError(f"sequence frame has {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big")


def _hashes(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise KvEventDecodeError(f"block_hashes is {type(value).__name__}, expected a list")
    out: list[int] = []
    for h in value:
        if isinstance(h, int):
            out.append(h & 0xFFFFFFFFFFFFFFFF)
        elif isinstance(h, bytes):  # some engines send raw digests; keep the last 8 bytes like vLLM
            out.append(int.from_bytes(h, "big") & 0xFFFFFFFFFFFFFFFF)
        else:
            raise KvEventDecodeError(f"block hash of type {type(h).__name__}")
    return out


def _opt_hash(value: Any) -> int | None:
    return None if value is None else _hashes([value])[0]


def _decode_event(raw: Any) -> KvEvent | None:
    """One event from its map or array form; None for an event type we do not use."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = {
            "BlockStored": _STORED_REQUIRED + _STORED_OPTIONAL,
            "BlockRemoved": _REMOVED_REQUIRED + _REMOVED_OPTIONAL,
        }.get(tag, ())
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KvEventDecodeError(f"event is neither a map nor a tagged array: {raw!r:.80}")
    if tag == "BlockStored":
        token_ids = fields.get("token_ids") or []
        block_hashes = _hashes(fields.get("block_hashes", []))
        block_size = fields.get("block_size")
        if not isinstance(block_size, int) or block_size <= 0:
            block_size = len(token_ids) // max(1, len(block_hashes))
        return BlockStored(
            block_hashes=block_hashes,
            parent_block_hash=_opt_hash(fields.get("parent_block_hash")),
            token_ids=list(token_ids),
            block_size=block_size,
            lora_id=fields.get("lora_id"),
            medium=fields.get("medium"),
            lora_name=fields.get("lora_name"),
            extra_keys=fields.get("extra_keys"),
            group_idx=fields.get("group_idx"),
            kv_cache_spec_kind=fields.get("kv_cache_spec_kind"),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes", [])),
            medium=fields.get("medium"),
            group_idx=fields.get("group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``EventBatch``; unknown event types are skipped.

    A stored event's ``TokenIds`` is a view of ``payload`` (it keeps it alive): pass ``bytes``, never a buffer
    that is written to again.
    """
    try:
        wire = _fast_decoder.decode(payload)
    except msgspec.DecodeError:  # not vLLM 0.32's map form (or not valid at all): the general path
        return _decode_general(payload)
    events: list[Any] = wire.events
    for i, ev in enumerate(events):
        cls = ev.__class__
        if cls is BlockRemoved:
            if ev.medium.__class__ is _Unsaid:
                ev.medium = None  # left out on the wire, as the general path reads it
        elif cls is _WireStored:
            f = _astuple(ev)
            raw = f[2]
            if memoryview(raw)[0] not in _ARRAY_HEADS:  # not an array (nil, say): the general path's reading
                return _decode_general(payload)
            ids: TokenIds = _new_ids(TokenIds)  # TokenIds(raw) without its __init__'s Python frame
            ids.packed = raw
            ids._ids = None
            stored = events[i] = BlockStored(*f)
            stored.token_ids = ids
    return EventBatch(wire.ts, events, wire.data_parallel_rank)


def _decode_general(payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KvEventDecodeError(f"not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventDecodeError(f"batch is not [ts, events, dp_rank]: {raw!r:.80}")
    events = [ev for ev in (_decode_event(item) for item in raw[1]) if ev is not None]
    dp_rank = raw[2] if len(raw) > 2 else None
    ts = float(raw[0]) if isinstance(raw[0], int | float) else 0.0
    return EventBatch(ts=ts, events=events, data_parallel_rank=dp_rank)


def _event_map(ev: KvEvent) -> dict[str, Any]:
    if isinstance(ev, BlockStored):
        out: dict[str, Any] = {"type": "BlockStored"}
        for name in _STORED_REQUIRED:
            out[name] = getattr(ev, name)
        for name in _STORED_OPTIONAL:
            value = getattr(ev, name)
            if value is not None:
                out[name] = value
        return out
    if isinstance(ev, BlockRemoved):
        out = {"type": "BlockRemoved"}
        for name in _REMOVED_REQUIRED:
            out[name] = getattr(ev, name)
        for name in _REMOVED_OPTIONAL:
            value = getattr(ev, name)
            if value is not None:
                out[name] = value
        return out
    return {"type": "AllBlocksCleared"}


def encode_batch(batch: EventBatch) -> bytes:
    """Encode as vLLM 0.32 does: the batch an array, each event a map."""
    body: list[Any] = [batch.ts, [_event_map(ev) for ev in batch.events]]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    return msgpack.packb(body, use_bin_type=True, default=_packable)  # type: ignore[no-any-return]


def _packable(obj: Any) -> Any:
    if isinstance(obj, TokenIds):
        return obj.ids()
    raise TypeError(f"cannot encode {type(obj).__name__}")

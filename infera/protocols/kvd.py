"""The kvd socket message: a one-way hint to pull a prompt's KV blocks into a worker's warm tier.

A KV daemon (kvd) listens on a Unix stream socket (the frontend's ``--kvd-socket-path``; the
mock engine serves one with its own ``--kvd-socket-path``). A client connects, writes one or
more hints and closes; the daemon never answers. Each hint is one line of UTF-8 JSON ended by
``\\n`` (so a hint never contains a raw newline), at most :data:`MAX_LINE_BYTES` long::

    {"v": 1, "kind": "prewarm", "worker": "mock-127.0.0.1-30001", "model": "Qwen/Qwen3-0.6B",
     "block_size": 16, "priority": 0,
     "blocks": [{"hash": "8d1f0c2a9b3e4f57", "token_ids": [151644, 872, ...]}, ...]}

- ``v``: the message version, :data:`KVD_VERSION`. A reader drops a line whose version it
  does not know (it must not guess at fields).
- ``kind``: ``"prewarm"``, the only kind of version 1.
- ``worker``: the instance id of the worker whose cache should be warmed (a daemon serving
  several workers dispatches on it; one serving a single worker ignores other ids).
- ``model``: the served model name, for the daemon's logs and sanity checks.
- ``block_size``: tokens per KV block; every block carries exactly this many token ids.
- ``priority``: an int, higher first; 0 is normal. A daemon may drop low-priority hints under
  pressure: a hint is advice, never a promise.
- ``blocks``: the prompt's leading full blocks, in order, starting at token 0 (the chain root),
  each with the router's chained 64-bit hash (:mod:`infera.kv.hashing`: xxh3_64 over the
  block's tokens as little-endian uint32, seeded with the parent's hash) written as 16
  lowercase hex digits (JSON numbers above 2**53 lose precision in many parsers), and its
  token ids. An engine-side daemon recomputes its engine's own block hashes from the token
  ids (vLLM and the mock chain sha256 digests); the router hash lets a daemon that shares
  the router's recipe deduplicate without rehashing.

Pure: encoding and decoding only; no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

KVD_VERSION = 1
KIND_PREWARM = "prewarm"
MAX_LINE_BYTES = 16 * 1024 * 1024


class KvdDecodeError(ValueError):
    """A line is not a kvd hint this reader understands; the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class KvdBlock:
    hash: int  # the router's chained hash of the block, unsigned 64-bit
    token_ids: tuple[int, ...]  # exactly block_size ids


@dataclasses.dataclass(frozen=True, slots=True)
class PrewarmHint:
    worker: str
    model: str
    block_size: int
    blocks: tuple[KvdBlock, ...]
    priority: int = 0

    def token_ids(self) -> list[int]:
        """All blocks' tokens, concatenated (the prompt's leading full blocks)."""
        return [t for block in self.blocks for t in block.token_ids]


def make_hint(worker: str, model: str, block_size: int, hashes: Sequence[int], token_ids: Sequence[int],
              priority: int = 0) -> PrewarmHint:
    """A hint for the first ``len(hashes)`` full blocks of ``token_ids``."""
    if len(token_ids) < len(hashes) * block_size:
        raise ValueError(f"{len(hashes)} blocks of {block_size} need {len(hashes) * block_size} tokens, "
                         f"got {len(token_ids)}")
    blocks = tuple(
        KvdBlock(h, tuple(token_ids[i * block_size:(i + 1) * block_size])) for i, h in enumerate(hashes))
    return PrewarmHint(worker, model, block_size, blocks, priority)


def encode_hint(hint: PrewarmHint) -> bytes:
    """One line of JSON, ``\\n`` included."""
    doc = {
        "v": KVD_VERSION,
        "kind": KIND_PREWARM,
        "worker": hint.worker,
        "model": hint.model,
        "block_size": hint.block_size,
        "priority": hint.priority,
        "blocks": [{"hash": f"{b.hash:016x}", "token_ids": list(b.token_ids)} for b in hint.blocks],
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KvdDecodeError(f"field {name!r} is missing or not a {getattr(kind, '__name__', kind)}")
    return value


def decode_hint(line: bytes | str) -> PrewarmHint:
    """Parse one line (with or without its ``\\n``); raises :class:`KvdDecodeError`."""
    if len(line) > MAX_LINE_BYTES:
        raise KvdDecodeError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KvdDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise KvdDecodeError("a hint is a JSON object")
    version = doc.get("v")
    if version != KVD_VERSION:
        raise KvdDecodeError(f"unsupported version {version!r} (this reader knows {KVD_VERSION})")
    if doc.get("kind") != KIND_PREWARM:
        raise KvdDecodeError(f"unknown kind {doc.get('kind')!r}")
    worker = _field(doc, "worker", str)
    model = doc.get("model", "")
    if not isinstance(model, str):
        raise KvdDecodeError("field 'model' is not a str")
    block_size = _field(doc, "block_size", int)
    if block_size <= 0:
        raise KvdDecodeError("block_size must be positive")
    priority = doc.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise KvdDecodeError("field 'priority' is not an int")
    raw_blocks = _field(doc, "blocks", list)
    blocks: list[KvdBlock] = []
    for i, raw in enumerate(raw_blocks):
        if not isinstance(raw, dict):
            raise KvdDecodeError(f"block {i} is not an object")
        text = raw.get("hash")
        try:
            if not isinstance(text, str) or len(text) != 16:
                raise ValueError
            value = int(text, 16)
        except ValueError as exc:
            raise KvdDecodeError(f"block {i}: hash must be 16 hex digits") from exc
        ids = raw.get("token_ids")
        if (not isinstance(ids, list) or len(ids) != block_size
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            raise KvdDecodeError(f"block {i}: token_ids must be {block_size} non-negative ints")
        blocks.append(KvdBlock(value, tuple(ids)))
    return PrewarmHint(worker, model, block_size, tuple(blocks), priority)

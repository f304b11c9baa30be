"""What the frontend and the worker wrappers say to each other over NATS: subjects and framing.

Requests: the frontend publishes the request body to ``infera.req.<worker>`` with a reply
subject and the NATS header :data:`PATH_HEADER` (plus the forwarded HTTP headers). The
worker streams its answer to that reply subject, one message per frame, each starting with
a one-byte tag: :data:`HEAD` + JSON ``{"status", "content_type"}`` first, then any number of
:data:`DATA` + bytes, then :data:`END`; or :data:`FAIL` + a message when it could not reach
its engine. A cancel is the reply subject, published to ``infera.cancel.<worker>``.

KV events: the worker relays each engine batch to ``infera.kv.events.<worker>`` as the
8-byte big-endian engine sequence number followed by the msgpack batch, unchanged. A replay
request to ``infera.kv.replay.<worker>`` carries the 8-byte start seq; the answer, on the
reply subject, is every buffered batch from there in the same framing, then the end marker
(:data:`REPLAY_END_SEQ`, empty payload).
"""

from __future__ import annotations

import json
import re

from infera.protocols.kv_events import REPLAY_END_SEQ, seq_to_bytes

__all__ = ["REPLAY_END_SEQ"]

REQ_PREFIX = "infera.req."
CANCEL_PREFIX = "infera.cancel."
KV_EVENTS_PREFIX = "infera.kv.events."
KV_REPLAY_PREFIX = "infera.kv.replay."
KV_EVENTS_ALL = KV_EVENTS_PREFIX + ">"

PATH_HEADER = "Infera-Path"

HEAD = b"H"
DATA = b"D"
END = b"E"
FAIL = b"X"

REPLAY_END = seq_to_bytes(REPLAY_END_SEQ)

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


def token(worker_id: str) -> str:
    """``worker_id`` as one NATS subject token (dots, spaces and wildcards become ``_``)."""
    return _UNSAFE.sub("_", worker_id) or "_"


def request_subject(worker_id: str) -> str:
    return REQ_PREFIX + token(worker_id)


def cancel_subject(request_subject: str) -> str:
    """The cancel subject of the worker that listens on ``request_subject``."""
    return CANCEL_PREFIX + request_subject.removeprefix(REQ_PREFIX)


def kv_events_subject(worker_id: str) -> str:
    return KV_EVENTS_PREFIX + token(worker_id)


def kv_replay_subject(events_subject: str) -> str:
    """The replay subject of the worker that publishes on ``events_subject``."""
    return KV_REPLAY_PREFIX + events_subject.removeprefix(KV_EVENTS_PREFIX)


def encode_head(status: int, content_type: str) -> bytes:
    return HEAD + json.dumps({"status": status, "content_type": content_type}).encode()


def decode_head(frame: bytes) -> tuple[int, str]:
    """(status, content type) of a :data:`HEAD` frame; ValueError if it is malformed."""
    doc = json.loads(frame[1:])
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), int):
        raise ValueError("malformed head frame")
    return int(doc["status"]), str(doc.get("content_type") or "application/json")

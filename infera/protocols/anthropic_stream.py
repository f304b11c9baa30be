"""Streaming translation: an engine's OpenAI chat SSE stream -> Anthropic message events.

:class:`StreamTranslator` is a small state machine fed the data payload of each OpenAI
chunk; it returns Anthropic events as ``(name, data)`` pairs in exactly Anthropic's order:
one ``message_start``; per content block ``content_block_start``, deltas (``text_delta``
or ``input_json_delta`` carrying tool arguments as they arrive), ``content_block_stop``;
then ``message_delta`` (stop reason, cumulative usage) and ``message_stop``. Text and each
tool call get their own block. What it cannot translate faithfully raises
:class:`StreamError`, which the caller turns into an ``error`` event: nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson

from infera.protocols.anthropic_convert import stop_reason, tool_use_id, usage_from_openai

Event = tuple[str, dict[str, Any]]

PING: Event = ("ping", {"type": "ping"})


class StreamError(Exception):
    """The engine's stream failed or cannot be translated; ``kind`` is the Anthropic error type."""

    def __init__(self, message: str, kind: str = "api_error") -> None:
        super().__init__(message)
        self.kind = kind


def encode(event: Event) -> bytes:
    """One Anthropic SSE event: ``event: <name>`` and its JSON ``data`` line."""
    name, data = event
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(kind: str, message: str) -> Event:
    return "error", {"type": "error", "error": {"type": kind, "message": message}}


class SseDecoder:
    """Split an SSE byte stream, in chunks cut anywhere, into the data payloads of its events."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        if b"\r" in self._buf:
            self._buf = self._buf.replace(b"\r\n", b"\n")
        out: list[str] = []
        while (end := self._buf.find(b"\n\n")) >= 0:
            raw, self._buf = self._buf[:end], self._buf[end + 2:]
            data = [line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
            if data:
                out.append(b"\n".join(data).decode("utf-8", "replace"))
        return out


class StreamTranslator:
    """OpenAI chat chunks in, Anthropic events out, for one message."""

    def __init__(self, message_id: str, model: str, stop_sequences: Sequence[str] | None) -> None:
        self.message_id = message_id
        self.model = model
        self.stop_sequences = list(stop_sequences or ())
        self._block = -1  # index of the last block started
        self._open: Literal["text", "tool"] | None = None
        self._tools: dict[int, int] = {}  # OpenAI tool_call index -> block index
        self._tool: int | None = None  # OpenAI index of the open tool block
        self._pending: dict[str, Any] | None = None  # a tool call whose name has not arrived yet
        self._finish: str | None = None
        self._matched: Any = None
        self._usage: Any = None
        self._saw_tools = False

    def start(self) -> list[Event]:
        message: dict[str, Any] = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                             "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": message})]

    def feed(self, data: str) -> list[Event]:
        """Events for one OpenAI chunk (the payload of one ``data:`` line)."""
        if data.strip() == "[DONE]":
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise StreamError(f"the worker sent a chunk that is not JSON: {data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise StreamError(f"the worker sent a chunk that is not an object: {data[:200]!r}")
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise StreamError(f"the worker failed mid-stream: {err.get('message', err)}")
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        events: list[Event] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._text(text)
            for call in delta.get("tool_calls") or ():
                events += self._tool_fragment(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason") or choice.get("matched_stop")
        return events

    def finish(self) -> list[Event]:
        """The closing events, once the engine's stream has ended."""
        if self._finish is None:
            raise StreamError("the worker's stream ended before the message was complete")
        events = self._close()
        reason, sequence = stop_reason(self._finish, self._matched, self.stop_sequences, self._saw_tools)
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": usage_from_openai(self._usage)}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    # ---- blocks --------------------------------------------------------------------------

    def _close(self) -> list[Event]:
        events = self._start_pending()
        if self._open is not None:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": self._block}))
        self._open = None
        self._tool = None
        return events

    def _begin(self, kind: Literal["text", "tool"], block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self._block += 1
        self._open = kind
        events.append(("content_block_start", {"type": "content_block_start", "index": self._block,
                                               "content_block": block}))
        return events

    def _text(self, text: str) -> list[Event]:
        events = self._begin("text", {"type": "text", "text": ""}) if self._open != "text" else []
        events.append(("content_block_delta", {"type": "content_block_delta", "index": self._block,
                                               "delta": {"type": "text_delta", "text": text}}))
        return events

    def _tool_fragment(self, call: Any) -> list[Event]:
        if not isinstance(call, dict):
            raise StreamError(f"the worker sent a malformed tool call delta: {call!r:.200}")
        index = int(call.get("index", 0))
        fn = call.get("function") or {}
        args = fn.get("arguments") or ""
        if not isinstance(args, str):
            args = orjson.dumps(args).decode()
        self._saw_tools = True
        if self._pending is not None and self._pending["index"] == index:
            pending = self._pending
            pending["id"] = pending["id"] or call.get("id")
            pending["name"] += fn.get("name") or ""
            pending["args"] += args
            return self._start_pending() if pending["name"] else []
        if index == self._tool:
            return [self._args_delta(args)] if args else []
        if index in self._tools:
            raise StreamError(f"the worker interleaved tool call {index} after a later block began; "
                              "Anthropic blocks cannot be reopened")
        events = self._close()
        self._pending = {"index": index, "id": call.get("id"), "name": fn.get("name") or "", "args": args}
        if self._pending["name"]:
            events += self._start_pending()
        return events

    def _start_pending(self) -> list[Event]:
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        index = pending["index"]
        block_id = pending["id"] or tool_use_id(self.message_id, len(self._tools))
        events = self._begin("tool", {"type": "tool_use", "id": block_id, "name": pending["name"], "input": {}})
        self._tools[index] = self._block
        self._tool = index
        if pending["args"]:
            events.append(self._args_delta(pending["args"]))
        return events

    def _args_delta(self, fragment: str) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self._block,
                                       "delta": {"type": "input_json_delta", "partial_json": fragment}}

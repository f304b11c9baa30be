"""What the relay learns from an OpenAI response without parsing it: did the stream end with
``data: [DONE]``, and what did the last ``usage`` object say.

Each chunk is scanned with ``bytes.find`` (C speed, no per-event parse); a marker split across two
chunks is caught by scanning the seam with it (the previous chunk's last bytes + this chunk).
Only the one event that carries a non-null usage is kept, and its token counts are read at the end.

Why the markers cannot be faked by generated text: inside a JSON string a quote is escaped and a
newline is ``\\n``, so ``"usage":`` (an unescaped quote before the colon) and a line that starts
with ``data: [DONE]`` only occur as the SSE/JSON structure itself.
"""

from __future__ import annotations

import dataclasses
import re

DONE = b"\ndata: [DONE]"  # the end marker as a line of its own (the stream start counts as a line start)
USAGE = b'"usage":'
_SEAM = max(len(DONE), len(USAGE) + 5) - 1  # bytes kept from the previous chunk (+5: ' null' after the key)
_KEEP = 4096  # most bytes kept of a usage event (a usage object is ~200 bytes)
_FIELD = re.compile(rb'"(prompt_tokens|completion_tokens|cached_tokens)":\s*(\d+)')


@dataclasses.dataclass(slots=True)
class Usage:
    """Token counts of one response, as the engine reported them (0 when it left a field out)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def read_usage(event: bytes) -> Usage | None:
    """The counts in the bytes that follow a ``"usage":`` key, up to the end of that event."""
    end = event.find(b"\n\n")
    return _counts(_FIELD.findall(event, 0, end if end >= 0 else len(event)))


def usage_of(body: bytes) -> Usage | None:
    """What ``StreamTally.of(body).usage()`` reads from a whole body (a non-streamed answer), without a
    tally: one search from the end for the last ``"usage":`` key, its counts read in place (no copy)."""
    at = body.rfind(USAGE)
    if at < 0:
        return None
    value = at + len(USAGE)
    if body[value:value + 1] != b"{" and body[value:value + 5].lstrip().startswith(b"n"):
        return None  # "usage": null
    end = body.find(b"\n\n", at, at + _KEEP)
    return _counts(_FIELD.findall(body, at, end if end >= 0 else at + _KEEP))


def _counts(found: list[tuple[bytes, bytes]]) -> Usage | None:
    if not found:
        return None
    fields = dict(found)
    return Usage(int(fields.get(b"prompt_tokens", 0)), int(fields.get(b"completion_tokens", 0)),
                 int(fields.get(b"cached_tokens", 0)))


class StreamTally:
    """Feed it every chunk of a response, in order; then read :attr:`done` and :meth:`usage`."""

    __slots__ = ("_open", "_seam", "_usage", "done")

    def __init__(self) -> None:
        self.done = False
        self._seam = b"\n"  # the stream starts at a line start
        self._usage = b""  # bytes from the last non-null "usage": key on
        self._open = False  # the kept usage event has not reached its end (b"\n\n") yet

    @classmethod
    def of(cls, body: bytes) -> StreamTally:
        """The tally of a whole body (a non-streamed response: its usage)."""
        tally = cls()
        tally.feed(body)
        return tally

    def feed(self, chunk: bytes) -> None:
        if self._open:
            self._usage += chunk[:_KEEP - len(self._usage)]
            self._open = self._usage.find(b"\n\n") < 0 and len(self._usage) < _KEEP
        # One search a marker over the seam and the chunk together (not one in each, and no seam of the chunk's
        # first bytes to build): a DONE cannot lie within the seam (it is longer), a USAGE key that does was
        # seen with the chunk before (the last key is taken: rfind finds it in the chunk, else across the seam).
        seam = self._seam
        data = seam + chunk
        if not self.done and data.find(DONE) >= 0:  # find, not `in`: on 3.11 that makes and drops a TypeError first
            self.done = True
        at = data.rfind(USAGE)
        if at >= 0 and at + len(USAGE) > len(seam):  # in the chunk or across the seam
            self._keep(data, at)
        self._seam = data[-_SEAM:]

    def _keep(self, data: bytes, at: int) -> None:
        if data[at + len(USAGE):at + len(USAGE) + 5].lstrip().startswith(b"n"):
            return  # "usage": null (SGLang sends it on every chunk)
        self._usage = data[at:at + _KEEP]
        self._open = self._usage.find(b"\n\n") < 0 and len(self._usage) < _KEEP

    def state(self) -> tuple[bytes, bytes, bool, bool]:
        """What the tally holds between chunks: (seam, usage bytes, usage event open, done); a C sink
        (csrc/splice.c) takes it over mid-stream and hands it back with :meth:`restore`."""
        return self._seam, self._usage, self._open, self.done

    def restore(self, seam: bytes, usage: bytes, open_: bool, done: bool) -> None:
        self._seam, self._usage, self._open, self.done = seam, usage, open_, done

    def usage(self) -> Usage | None:
        """The last non-null usage object's counts, or None when the response carried none."""
        return read_usage(self._usage) if self._usage else None

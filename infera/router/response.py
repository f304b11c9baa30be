"""What a dispatch hands the server: a worker's response with its first body chunk in hand."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from infera.transport.base import UpstreamResponse


class RoutedResponse:
    """A worker's response with its first body chunk already in hand.

    Read the body once, either way: iterate :meth:`chunks` (it closes the response when it
    ends, fails or is abandoned), or take :attr:`first`, then :meth:`drain` and :attr:`rest`
    directly (the relay's way: no generator per chunk) and call :meth:`close` at the end.
    Closing releases the ticket(s) and the upstream; it is idempotent. For a disaggregated
    request this is the decode worker's response and ``prefill_worker_id`` names the
    prefill worker that computed the prompt.
    """

    def __init__(self, worker_id: str, upstream: UpstreamResponse, first: bytes, finish: Callable[[], None],
                 prefill_worker_id: str | None = None) -> None:
        self.worker_id = worker_id
        self.prefill_worker_id = prefill_worker_id
        self.status = upstream.status
        self.content_type = upstream.content_type
        self.first = first  # b"" for an empty body
        self.rest: AsyncIterator[bytes] = upstream.body  # the chunks after the first
        self.drain = upstream.drain  # () -> bytes already received after the first, without waiting
        self.ended = upstream.ended  # () -> True when nothing is left to read (a whole answer in hand)
        self.pipe = upstream.pipe  # instead of rest, where the transport can: see UpstreamResponse
        self._upstream = upstream
        self._finish: Callable[[], None] | None = finish

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            if self.first:
                yield self.first
            async for chunk in self.rest:
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._upstream.close()
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


def _ended() -> bool:
    return True


def buffered(worker_id: str, status: int, content_type: str, data: bytes,
             prefill_worker_id: str | None = None) -> RoutedResponse:
    """A response read to the end already (e.g. a prefill worker's 4xx, relayed as is)."""
    upstream = UpstreamResponse(status=status, content_type=content_type, body=_nothing(), close=lambda: None,
                                ended=_ended)
    return RoutedResponse(worker_id, upstream, data, lambda: None, prefill_worker_id)

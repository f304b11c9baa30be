"""Dispatch in the handler's own task: a client that leaves cancels the dispatch, not the handler."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infera.router.response import RoutedResponse
from infera.server.relay import ClientWatch, Disconnects, collect_or_disconnect, dispatch_or_disconnect
from infera.transport.base import UpstreamError, UpstreamResponse


class Client:
    """An ASGI receive() that reports a disconnect once :meth:`leave` is called."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}


class SlowRouter:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False
        self.calls = 0

    async def dispatch(self, req: Any, headers: Any) -> str:
        self.calls += 1
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "routed"


async def test_a_client_that_leaves_mid_dispatch_gets_none_and_the_handler_task_goes_on() -> None:
    client, router = Client(), SlowRouter()
    watch = ClientWatch(client.receive)

    async def handler() -> tuple[Any, int]:
        result = await dispatch_or_disconnect(router, watch, None, {})  # type: ignore[arg-type]
        await asyncio.sleep(0)  # a cancellation left pending on this task would strike here
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    task = asyncio.ensure_future(handler())
    await router.started.wait()
    client.leave()
    result, cancelling = await asyncio.wait_for(task, 5)
    assert result is None and router.cancelled and cancelling == 0
    watch.stop()


async def test_a_dispatch_that_ends_in_time_is_returned() -> None:
    client = Client()
    watch = ClientWatch(client.receive)

    class Quick:
        async def dispatch(self, req: Any, headers: Any) -> str:
            await asyncio.sleep(0)
            return "routed"

    assert await dispatch_or_disconnect(Quick(), watch, None, {}) == "routed"  # type: ignore[arg-type]
    client.leave()  # after the dispatch: nothing is cancelled any more
    await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    watch.stop()


async def test_a_client_gone_before_the_dispatch_starts_is_not_dispatched() -> None:
    client, router = Client(), SlowRouter()
    client.leave()
    watch = ClientWatch(client.receive)
    await asyncio.sleep(0.01)
    assert watch.left
    assert await dispatch_or_disconnect(router, watch, None, {}) is None  # type: ignore[arg-type]
    assert router.calls == 0
    await asyncio.sleep(0)  # and this task carries no pending cancellation


async def test_a_cancellation_from_elsewhere_still_cancels_the_handler() -> None:
    client = Client()
    watch = ClientWatch(client.receive)
    cleaning = asyncio.Event()

    class SlowToRelease:
        async def dispatch(self, req: Any, headers: Any) -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cleaning.set()
                await asyncio.sleep(60)  # releasing takes a while; the server shuts down meanwhile
                raise
            return "routed"

    task = asyncio.ensure_future(dispatch_or_disconnect(SlowToRelease(), watch, None, {}))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    client.leave()
    await asyncio.wait_for(cleaning.wait(), 5)
    task.cancel()  # e.g. the server shutting down: not the client's cancellation, so it must go on
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    watch.stop()


class Body:
    """An upstream body that yields ``chunks``, or raises ``fail`` after them; counts its reads."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None) -> None:
        self.chunks = list(chunks)
        self.fail = fail
        self.reads = 0

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        self.reads += 1
        if self.chunks:
            return self.chunks.pop(0)
        if self.fail is not None:
            raise self.fail
        raise StopAsyncIteration


def routed_of(first: bytes, body: Body, *, buffered: bytes = b"", ended: bool = False) -> RoutedResponse:
    held = [buffered]

    def drain() -> bytes:
        out, held[0] = held[0], b""
        return out

    upstream = UpstreamResponse(200, "application/json", body, close=lambda: None, drain=drain,
                                ended=lambda: ended)
    return RoutedResponse("w", upstream, first, lambda: None)


async def test_a_whole_answer_in_hand_is_collected_without_another_read() -> None:
    body = Body([b"never read"])
    watch = ClientWatch(Client().receive, Disconnects())
    got = await collect_or_disconnect(watch, routed_of(b'{"a": ', body, buffered=b"1}", ended=True))
    assert got == b'{"a": 1}' and body.reads == 0


async def test_an_answer_not_ended_is_read_to_its_end() -> None:
    body = Body([b"2", b"3}"])
    watch = ClientWatch(Client().receive, Disconnects())
    got = await collect_or_disconnect(watch, routed_of(b'{"a": ', body, buffered=b"1"))
    assert got == b'{"a": 123}' and body.reads == 3


async def test_a_worker_failing_before_the_end_of_an_answer_still_fails_the_collect() -> None:
    body = Body([b"2"], fail=UpstreamError("broke", before_first_byte=False))
    watch = ClientWatch(Client().receive, Disconnects())
    with pytest.raises(UpstreamError, match="broke"):
        await collect_or_disconnect(watch, routed_of(b'{"a": ', body))


async def test_the_protocols_task_is_the_one_a_client_leaving_cancels() -> None:
    router, disconnects = SlowRouter(), Disconnects()
    watch = ClientWatch(Client().receive, disconnects)

    async def handler() -> Any:
        return await dispatch_or_disconnect(router, watch, None, {})  # type: ignore[arg-type]

    task = disconnects.task = asyncio.ensure_future(handler())
    await router.started.wait()
    disconnects.fire()
    assert await asyncio.wait_for(task, 5) is None and router.cancelled

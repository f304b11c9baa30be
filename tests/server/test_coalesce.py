"""A response's head goes out with its body in one write, and never waits for a late body."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from infera.server.coalesce import CoalescingHttpToolsProtocol, HeadHold


class Spy:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Cycle:
    response_started = False


def hold() -> tuple[HeadHold, Spy, Cycle]:
    spy, cycle = Spy(), Cycle()
    return HeadHold(spy, cycle, asyncio.get_running_loop()), spy, cycle  # type: ignore[arg-type]


async def test_head_and_body_are_one_write() -> None:
    held, spy, cycle = hold()
    cycle.response_started = True
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert spy.writes == []
    held.write(b"body")
    assert spy.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    held.write(b"more")
    assert spy.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]


async def test_a_large_body_goes_with_the_head_too() -> None:
    held, spy, cycle = hold()
    cycle.response_started = True
    held.write(b"HEAD")
    held.write(b"x" * (1 << 20))
    assert spy.writes == [b"HEAD" + b"x" * (1 << 20)]


async def test_a_head_whose_body_is_late_goes_out_by_itself_at_the_next_loop_turn() -> None:
    held, spy, cycle = hold()
    cycle.response_started = True
    held.write(b"HEAD")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert spy.writes == [b"HEAD"]
    held.write(b"body")
    assert spy.writes == [b"HEAD", b"body"]


async def test_an_interim_100_continue_is_not_held() -> None:
    held, spy, cycle = hold()
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # written by receive(), before the response starts
    assert spy.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.response_started = True
    held.write(b"HEAD")
    held.write(b"body")
    assert spy.writes[1:] == [b"HEADbody"]


async def test_closing_sends_a_held_head_first() -> None:
    held, spy, cycle = hold()
    cycle.response_started = True
    held.write(b"HEAD")
    held.close()
    assert spy.writes == [b"HEAD"] and spy.closed


async def _serve(app: Any) -> tuple[uvicorn.Server, int, asyncio.Task[None]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=CoalescingHttpToolsProtocol, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    for _ in range(1000):  # up to 10 s
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started
    return server, port, task


@pytest.mark.parametrize("late", [False, True])
async def test_through_uvicorn_a_client_gets_the_whole_answer_and_a_late_bodys_head_first(late: bool) -> None:
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        if late:
            await go.wait()
        await send({"type": "http.response.body", "body": b"hello"})

    server, port, task = await _serve(app)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 5" in head.lower()
        go.set()
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
        writer.close()
    finally:
        server.should_exit = True
        await task

"""The ZMTP reader (infera.transport.zmtp) against libzmq's own PUB, and its C drain (``PrefixIndex.drain_stream``)
over real sockets: whole streams, byte by byte, many messages a read, long frames, commands between messages."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import select
import socket
import struct
import termios
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import await_until, wait_until
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import BlockStored, EventBatch, encode_batch, seq_to_bytes
from infera.transport.base import (
    DRAIN_BROKEN,
    DRAIN_COMMAND,
    DRAIN_EMPTY,
    DRAIN_FAILED,
    DRAIN_FRAMES,
    DRAIN_MESSAGE,
    StreamState,
)
from infera.transport.zmtp import MORE, ZmtpClosed, ZmtpLink, command, frame, split, tcp_address
from tests.kv.test_index_payload import PREFIX, _start, _state, payloads

TOPIC = b"kv-events"
BLOCK = 4

native = pytest.mark.skipif(not PrefixIndex().takes_streams, reason="the index's C path is not built")


def batch(seq: int, blocks: int, first: int) -> bytes:
    """One stored-blocks payload of ``blocks`` blocks, hashes from ``first``."""
    hashes = list(range(first, first + blocks))
    tokens = [(h * 7 + j) % 50_000 for h in hashes for j in range(BLOCK)]
    return encode_batch(EventBatch(ts=float(seq), events=[BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=BLOCK)]))


def message(*frames: bytes) -> bytes:
    """A message on the wire, as libzmq frames it."""
    return b"".join(frame(f, MORE if i < len(frames) - 1 else 0) for i, f in enumerate(frames))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected TCP pair (the reader's end non-blocking): the test writes the PUB's side byte by byte."""
    server = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(server.getsockname())
    theirs, _ = server.accept()
    server.close()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_tcp_endpoints_are_ours_and_every_other_is_libzmqs() -> None:
    assert tcp_address("tcp://127.0.0.1:5557") == ("127.0.0.1", 5557)
    assert tcp_address("tcp://engine-0.svc:5557") == ("engine-0.svc", 5557)
    assert tcp_address("tcp://[::1]:5557") == ("::1", 5557)
    for other in ("ipc:///tmp/kv", "inproc://kv", "tcp://*:5557", "tcp://127.0.0.1", "tcp://10.0.0.1;127.0.0.1:5557",
                  "tcp://127.0.0.1:notaport", "pgm://eth0;239.192.1.1:5555"):
        assert tcp_address(other) is None, other


def test_frames_match_libzmqs_encoding_short_and_long() -> None:
    assert frame(b"abc") == b"\x00\x03abc"
    assert frame(b"x" * 256, MORE) == b"\x03" + (256).to_bytes(8, "big") + b"x" * 256
    assert split(message(b"a", b"b" * 300, b"c"), 0) == (2 + 1 + 9 + 300 + 2 + 1, [b"a", b"b" * 300, b"c"], False)
    assert split(message(b"a", b"b"), 0)[:2] == (6, [b"a", b"b"])  # type: ignore[index]
    wire = message(b"a", b"b")
    for cut in range(len(wire)):
        assert split(wire[:cut], 0) is None
    assert split(command(b"PING", b"\x00\x00"), 0) == (9, [b"\x04PING\x00\x00"], True)
    with pytest.raises(ZmtpClosed):
        split(frame(b"a", MORE) + command(b"PING"), 0)


async def test_the_handshake_with_libzmqs_pub_subscribes_and_long_messages_arrive_whole() -> None:
    """libzmq's XPUB sees our subscription; its messages, short, over 255 bytes and over 64 KiB, come out whole,
    others' topics filtered out by the PUB."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    link = ZmtpLink("127.0.0.1", port, TOPIC)
    try:
        await asyncio.wait_for(link.open(), 5)
        assert await asyncio.wait_for(pub.recv(), 5) == b"\x01" + TOPIC
        sent = [[TOPIC, seq_to_bytes(i), bytes([i]) * size] for i, size in enumerate((0, 1, 255, 256, 70_000, 300_000))]
        for frames in sent:
            await pub.send_multipart([b"other", b"x", b"y"])
            await pub.send_multipart(frames)
        got: list[list[bytes]] = []

        def read_all() -> bool:
            while (frames := link.read()) is not None:
                got.append(frames)
            return len(got) == len(sent)

        await await_until(read_all, 5, "every message")
        assert got == sent
    finally:
        link.close()
        pub.close(0)
        ctx.destroy(0)


async def test_a_pub_with_heartbeats_gets_its_pongs_and_keeps_the_connection() -> None:
    """libzmq's PUB with ZMQ_HEARTBEAT_IVL sends PINGs and drops a peer that does not answer within its timeout:
    read while idle (the source's backstop), ours answer, and the connection lives past many timeouts."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.HEARTBEAT_IVL, 20)
    pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 100)
    monitor = pub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    link = ZmtpLink("127.0.0.1", port, TOPIC)
    try:
        await asyncio.wait_for(link.open(), 5)
        loop = asyncio.get_running_loop()
        loop.add_reader(link.fd, link.read)  # commands only: read() answers them and finds no message
        await asyncio.sleep(0.6)  # six timeouts
        loop.remove_reader(link.fd)
        assert not await monitor.poll(0), "the PUB dropped the connection"
        await pub.send_multipart([TOPIC, seq_to_bytes(0), b"p"])
        got: list[list[bytes]] = []

        def arrived() -> bool:
            frames = link.read()
            if frames is not None:
                got.append(frames)
            return bool(got)

        await await_until(arrived, 5, "the message")
        assert got == [[TOPIC, seq_to_bytes(0), b"p"]]
    finally:
        link.close()
        pub.disable_monitor()
        monitor.close(0)
        pub.close(0)
        ctx.destroy(0)


def peer_ended(sock: socket.socket) -> bool:
    """Whether the peer's end (its FIN) has reached ``sock``."""
    probe = select.poll()
    probe.register(sock.fileno(), select.POLLRDHUP)
    return bool(probe.poll(0))


def queued(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])


def drain(index: PrefixIndex, ours: socket.socket, buffer: bytearray, expected: int | None) -> tuple[int, int | None,
                                                                                                     int, object]:
    got = index.drain_stream("w1", ours.fileno(), buffer, expected)
    assert got is not None
    return got


def known(index: PrefixIndex) -> PrefixIndex:
    """``index`` knowing worker w1 (the C drain reads for known workers only)."""
    index.apply("w1", EventBatch(ts=0.0, events=[]))
    return index


@native
def test_the_c_drain_takes_a_stream_written_byte_by_byte(pair: tuple[socket.socket, socket.socket]) -> None:
    """Every cut of the stream (a frame's flags, its size, its body, a long size) is kept and completed by the next
    read; each message is applied once whole, in order, and the index ends as a whole-stream apply leaves it."""
    ours, theirs = pair
    payloads = [batch(i, 3 if i % 2 else 70, 1000 * (i + 1)) for i in range(4)]  # 70 blocks: a frame over 255 bytes
    wire = b"".join(message(TOPIC, seq_to_bytes(i), p) for i, p in enumerate(payloads))
    index, reference = known(PrefixIndex(block_size=BLOCK)), known(PrefixIndex(block_size=BLOCK))
    for p in payloads:
        assert reference.apply_payload("w1", p)
    buffer, expected, applied = bytearray(), 0, 0
    for byte in wire:
        theirs.sendall(bytes([byte]))
        status, expected, n, extra = drain(index, ours, buffer, expected)  # type: ignore[assignment]
        assert status == DRAIN_EMPTY and extra is None
        applied += n
    assert applied == 4 and expected == 4 and buffer == b""
    assert index.held("w1") == reference.held("w1") and index.counters.as_dict() == reference.counters.as_dict()


@native
def test_the_c_drain_takes_many_messages_in_one_read_and_leaves_a_partial_one(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    wire = b"".join(message(TOPIC, seq_to_bytes(i), batch(i, 1, 10 * (i + 1))) for i in range(200))
    tail = message(TOPIC, seq_to_bytes(200), batch(200, 1, 5000))
    theirs.sendall(wire + tail[:7])
    wait_until(lambda: queued(ours) == len(wire) + 7, 5, "the bytes in our socket's buffer")
    index, buffer = known(PrefixIndex(block_size=BLOCK)), bytearray()
    status, expected, n, _ = drain(index, ours, buffer, 0)  # one call: 200 messages in ~4 reads of 64 KiB
    assert (status, expected, n, bytes(buffer)) == (DRAIN_EMPTY, 200, 200, tail[:7])
    assert index.block_count("w1") == 200
    theirs.sendall(tail[7:])
    status, expected, n, _ = drain(index, ours, buffer, expected)
    assert (status, expected, n, bytes(buffer)) == (DRAIN_EMPTY, 201, 1, b"")


@native
def test_the_c_drain_stops_at_a_command_and_what_it_leaves_python(pair: tuple[socket.socket, socket.socket]) -> None:
    """A command at the head: nothing taken (Python's read answers it). A gap: the message back whole. Another frame
    count: taken and counted. The peer's end: an OSError after the messages before it."""
    ours, theirs = pair
    index = known(PrefixIndex(block_size=BLOCK))
    link = ZmtpLink("127.0.0.1", 1, TOPIC)
    link.sock = ours
    theirs.sendall(message(TOPIC, seq_to_bytes(0), batch(0, 1, 10)) + command(b"PING", b"\x00\x0aab")
                   + message(TOPIC, seq_to_bytes(1), batch(1, 1, 20)))
    status, expected, n, _ = drain(index, ours, link.buffer, 0)
    assert (status, expected, n) == (DRAIN_COMMAND, 1, 1)
    assert link.read() == [TOPIC, seq_to_bytes(1), batch(1, 1, 20)]  # the PING answered, the message read
    assert theirs.recv(100) == command(b"PONG", b"ab")
    theirs.sendall(message(TOPIC, seq_to_bytes(5), b"gap") + message(TOPIC, b"only two"))
    status, expected, n, extra = drain(index, ours, link.buffer, 2)
    assert (status, expected, n, extra) == (DRAIN_MESSAGE, 2, 0, [TOPIC, seq_to_bytes(5), b"gap"])
    status, expected, n, extra = drain(index, ours, link.buffer, 2)
    assert (status, extra) == (DRAIN_FRAMES, 2)
    theirs.sendall(message(TOPIC, seq_to_bytes(2), batch(2, 1, 30)))
    theirs.close()
    status, expected, n, extra = drain(index, ours, link.buffer, 2)
    assert (expected, n) == (3, 1) and isinstance(extra, ConnectionError)
    link.sock = None


@native
def test_one_call_drains_every_ready_stream_as_drain_stream_does_and_leaves_the_rest(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """``PrefixIndex.drain_ready``: one epoll_wait, then every ready stream of a known worker, not busy, drained as
    ``drain_stream`` drains it (its state's ``expected`` set); a stream it does not own, a busy one, one of a worker
    the index does not know go back as descriptors; a command, a gap, the peer's end come back with the state, after
    the messages before them were applied (the same state as ``drain_stream``'s, call by call)."""
    ours, theirs = pair
    server = socket.create_server(("127.0.0.1", 0))
    extra_socks = []
    for _ in range(3):
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
        a.setblocking(False)
        extra_socks.append((a, b))
    server.close()
    busy_ours, busy_theirs = extra_socks[0]  # busy: the source's task owns it
    new_ours, new_theirs = extra_socks[1]  # a worker the index does not know
    other_ours, other_theirs = extra_socks[2]  # not a stream the call owns (a libzmq link's, say)
    index, reference = known(PrefixIndex(block_size=BLOCK)), known(PrefixIndex(block_size=BLOCK))
    poller = select.epoll()
    try:
        states = {}
        for sock, wid in [(ours, "w1"), (busy_ours, "w1"), (new_ours, "w9")]:
            state = StreamState(wid)
            state.busy = sock is busy_ours
            state.expected = 0
            states[sock.fileno()] = state
        for sock in (ours, busy_ours, new_ours, other_ours):  # as the source registers its streams
            poller.register(sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        ref_buffer = bytearray()
        ref_expected: int | None = 0
        wire = (message(TOPIC, seq_to_bytes(0), batch(0, 3, 10)) + command(b"PING", b"\x00\x0aab")
                + message(TOPIC, seq_to_bytes(1), batch(1, 2, 20)))
        for sock in (busy_theirs, new_theirs, other_theirs):
            sock.sendall(b"x")
        theirs.sendall(wire)
        wait_until(lambda: queued(ours) == len(wire) and queued(other_ours) == 1, 5, "the bytes")
        # the reference: the same bytes through drain_stream (a copy of the stream, on a second index)
        r1, r2 = socket.socketpair()
        r2.setblocking(False)
        r1.sendall(wire)
        others, left, arrived = index.drain_ready(poller.fileno(), states)
        assert sorted(others) == sorted([busy_ours.fileno(), new_ours.fileno(), other_ours.fileno()])
        state = states[ours.fileno()]
        ref = reference.drain_stream("w1", r2.fileno(), ref_buffer, ref_expected)
        assert ref is not None
        assert left == [(state, DRAIN_COMMAND, None)] and arrived == [("w1", 1)]
        assert (ref[0], ref[1], ref[2]) == (DRAIN_COMMAND, 1, 1) and state.expected == 1
        assert state.buffer == ref_buffer and state.buffer.startswith(command(b"PING", b"\x00\x0aab"))
        # what a link's reader does with a command (answers it) is the source's; here: past it, as Python would
        link = ZmtpLink("127.0.0.1", 1, TOPIC)
        link.sock, link.buffer = ours, state.buffer
        assert link.read() == [TOPIC, seq_to_bytes(1), batch(1, 2, 20)]
        assert reference.apply_payload("w1", batch(1, 2, 20)) and index.apply_payload("w1", batch(1, 2, 20))
        assert theirs.recv(100) == command(b"PONG", b"ab")
        state.expected = 2
        link.sock = None
        # a gap, then messages and the peer's end: reported in the call that applied the messages before it
        theirs.sendall(message(TOPIC, seq_to_bytes(2), batch(2, 1, 30)) + message(TOPIC, seq_to_bytes(5), b"gap"))
        wait_until(lambda: queued(ours) > 0, 5, "the bytes")
        others, left, arrived = index.drain_ready(poller.fileno(), {ours.fileno(): state})
        assert left == [(state, DRAIN_MESSAGE, [TOPIC, seq_to_bytes(5), b"gap"])] and arrived == [("w1", 1)]
        assert state.expected == 3 and reference.apply_payload("w1", batch(2, 1, 30))
        theirs.sendall(message(TOPIC, seq_to_bytes(3), batch(3, 1, 40)))
        theirs.close()
        wait_until(lambda: peer_ended(ours), 5, "the peer's end")
        others, left, arrived = index.drain_ready(poller.fileno(), {ours.fileno(): state})
        assert arrived == [("w1", 1)] and len(left) == 1 and left[0][1] == DRAIN_BROKEN
        assert isinstance(left[0][2], ConnectionError) and state.expected == 4
        assert reference.apply_payload("w1", batch(3, 1, 40))
        assert index.held("w1") == reference.held("w1") and index.counters.as_dict() == reference.counters.as_dict()
        assert index.cache_view("w1")["blocks"] == reference.cache_view("w1")["blocks"]
        r1.close()
        r2.close()
    finally:
        poller.close()
        for a, b in extra_socks:
            a.close()
            b.close()


@native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "a", "b"]), payloads()), min_size=1, max_size=10),
       st.sampled_from([None, 4]))
def test_one_call_books_each_drain_as_the_index_and_the_feed_book_a_payload(
        sends: list[tuple[str, bytes]], block_size: int | None) -> None:
    """``drain_ready`` books what each drain applied in the same C call (the counters, the orphans, the worker's
    times, the touched rows of remembered walks; the caller's ``book`` of arrivals): the index ends as
    ``apply_payload`` (Python's ``_applied``) leaves it payload by payload, and the book as ``IndexFeed._arrived``
    leaves its tables; a payload it declines or whose apply raises comes back, booked by nobody."""
    logging.disable(logging.CRITICAL)
    ends = {wid: socket.socketpair() for wid in ("a", "b")}
    poller = select.epoll()
    try:
        index, reference = _start(block_size), _start(block_size)
        states = {}
        for wid, (ours, _) in ends.items():
            ours.setblocking(False)
            states[ours.fileno()] = state = StreamState(wid)
            state.busy = False
            poller.register(ours.fileno(), select.EPOLLIN)
        batches: Counter[str] = Counter({"a": 3})
        last: dict[str, float] = {"b": 0.5}
        owed = {"a": 0.25, "b": 0.25, "z": 0.25}
        ref_batches, ref_last, ref_owed = Counter(batches), dict(last), dict(owed)
        for seq, (wid, payload) in enumerate(sends):
            try:
                took: bool | None = reference.apply_payload(wid, payload, now=2.0)
            except Exception:
                took = None  # its apply raised: the C's apply raises too (the drain's DRAIN_FAILED)
            if took:
                ref_batches[wid] += 1
                ref_last[wid] = 9.0
                ref_owed.pop(wid, None)
            theirs = ends[wid][1]
            theirs.sendall(message(TOPIC, seq_to_bytes(seq), payload))
            ours = ends[wid][0]
            wait_until(lambda: queued(ours) > 0, 5, "the bytes")  # noqa: B023
            for state in states.values():
                state.expected = None
            others, left, arrived = index.drain_ready(poller.fileno(), states, now=2.0,
                                                      book=(batches, last, owed, 9.0))
            assert others == []
            assert arrived == ([(wid, 1)] if took else [])
            assert [status for _, status, _ in left] == ([] if took else [DRAIN_MESSAGE] if took is False
                                                         else [DRAIN_FAILED])
            assert _state(index) == _state(reference), payload
            assert (batches, last, owed) == (ref_batches, ref_last, ref_owed)
        walk = list(reference._holders.keys())[:PREFIX]
        assert index.overlaps(walk) == reference.overlaps(walk)  # the remembered walks, settled from touched rows
        # without ``now``, each worker's last_applied_at is the wall clock after its drain, as time.time() would say
        ends["b"][1].sendall(message(TOPIC, seq_to_bytes(99), batch(0, 1, 123456)))
        wait_until(lambda: queued(ends["b"][0]) > 0, 5, "the bytes")
        for state in states.values():
            state.expected = None
        before = time.time()
        others, left, arrived = index.drain_ready(poller.fileno(), states)
        assert arrived == [("b", 1)] and left == [] and before <= index._workers["b"].last_applied_at <= time.time()
    finally:
        logging.disable(logging.NOTSET)
        poller.close()
        for a, b in ends.values():
            a.close()
            b.close()


@native
def test_one_call_stops_at_a_short_read_unless_the_epoll_saw_the_peers_end(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A ready stream whose epoll event says nothing of the peer's end is read until a read returns less than it
    asked for, not once more for EAGAIN: what arrives after that read (a message's rest, the peer's end) is taken
    at the next call, in order; a peer's end the epoll_wait saw is read in the same call, after the bytes before it."""
    ours, theirs = pair
    index = known(PrefixIndex(block_size=BLOCK))
    poller = select.epoll()
    try:
        poller.register(ours.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        state = StreamState("w1")
        state.busy, state.expected = False, 0
        streams = {ours.fileno(): state}
        whole = message(TOPIC, seq_to_bytes(1), batch(1, 2, 20))
        theirs.sendall(message(TOPIC, seq_to_bytes(0), batch(0, 3, 10)) + whole[:7])
        wait_until(lambda: queued(ours) > 0, 5, "the bytes")
        assert index.drain_ready(poller.fileno(), streams)[1:] == ([], [("w1", 1)])
        assert state.expected == 1 and state.buffer == whole[:7]
        theirs.sendall(whole[7:])
        wait_until(lambda: queued(ours) > 0, 5, "the bytes")
        assert index.drain_ready(poller.fileno(), streams)[1:] == ([], [("w1", 1)])
        assert state.expected == 2 and state.buffer == bytearray()
        assert index.drain_ready(poller.fileno(), streams) == ([], [], [])  # nothing signals: nothing read
        theirs.sendall(message(TOPIC, seq_to_bytes(2), batch(2, 1, 30)))
        theirs.close()
        wait_until(lambda: peer_ended(ours), 5, "the peer's end")
        _, left, arrived = index.drain_ready(poller.fileno(), streams)
        assert arrived == [("w1", 1)] and [status for _, status, _ in left] == [DRAIN_BROKEN]
        assert isinstance(left[0][2], ConnectionError) and state.expected == 3
        # registered without EPOLLRDHUP the event cannot tell, so the call stops at the short read: the peer's end,
        # there already, comes at the next call (which is why the source registers its streams with it)
        poller.unregister(ours.fileno())
        server = socket.create_server(("127.0.0.1", 0))
        plain, plain_theirs = socket.create_connection(server.getsockname()), server.accept()[0]
        server.close()
        with plain, plain_theirs:
            plain.setblocking(False)
            poller.register(plain.fileno(), select.EPOLLIN)
            state.buffer = bytearray()
            streams = {plain.fileno(): state}
            plain_theirs.sendall(message(TOPIC, seq_to_bytes(3), batch(3, 1, 40)))
            plain_theirs.close()
            wait_until(lambda: peer_ended(plain), 5, "the peer's end")
            assert index.drain_ready(poller.fileno(), streams)[1:] == ([], [("w1", 1)])
            _, left, arrived = index.drain_ready(poller.fileno(), streams)
            assert arrived == [] and [status for _, status, _ in left] == [DRAIN_BROKEN] and state.expected == 4
    finally:
        poller.close()

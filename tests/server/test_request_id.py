"""Request ids made here: the format clients see, unique across the ids made ahead in a batch and across
a fork (a server's worker processes are forked)."""

from __future__ import annotations

import os
import re

from infera.server.request_id import HEADER, new_id, new_id_bytes, take_id

FORMAT = re.compile(r"req_[0-9a-f]{24}")


def test_made_ids_keep_their_format_and_never_repeat_across_batches() -> None:
    ids = [new_id() for _ in range(500)] + [new_id_bytes().decode() for _ in range(500)]
    assert all(FORMAT.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_request_without_a_valid_id_gets_a_made_one_in_its_headers() -> None:
    for headers in ([(b"host", b"x")], [(b"host", b"x"), (HEADER, b"bad id with spaces")]):
        rid, replaced = take_id(headers)
        assert FORMAT.fullmatch(rid.decode()) and replaced is not None
        assert [v for k, v in replaced if k == HEADER] == [rid]
    assert take_id([(HEADER, b"client-id")]) == (b"client-id", None)


def test_a_forked_process_does_not_hand_out_its_parents_ids() -> None:
    new_id()  # the parent holds ids made ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids, then out without pytest's teardown
        try:
            os.write(write, " ".join(new_id() for _ in range(100)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = set(pipe.read().decode().split())
    os.waitpid(pid, 0)
    parent = {new_id() for _ in range(100)}
    assert len(child) == 100 and not child & parent

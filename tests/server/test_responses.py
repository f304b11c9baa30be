"""A worker's whole answer (``WholeResponse``) has Starlette's own raw headers, built in one step."""

from __future__ import annotations

import pytest
from starlette.responses import Response

from infera.server.responses import WholeResponse

WORKER = [(b"x-infera-worker", b"w1"), (b"x-infera-prefill-worker", b"p1")]


@pytest.mark.parametrize("status", [200, 201, 204, 304, 400, 404, 429, 101])
@pytest.mark.parametrize("media_type", ["application/json", "text/plain", "text/plain; charset=latin-1",
                                        "text/html; Charset=utf-8", "application/x-ndjson", "TEXT/plain"])
@pytest.mark.parametrize("headers", [WORKER[:1], WORKER])
def test_a_whole_answer_has_starlettes_headers(status: int, media_type: str,
                                               headers: list[tuple[bytes, bytes]]) -> None:
    body = b'{"ok": true}'
    whole = WholeResponse(body, status, media_type, headers)
    starlette = Response(body, status_code=status, media_type=media_type,
                         headers={k.decode(): v.decode() for k, v in headers})
    assert (whole.status_code, whole.body, whole.raw_headers, whole.media_type, whole.background) == (
        starlette.status_code, starlette.body, starlette.raw_headers, starlette.media_type, starlette.background)
    assert headers == WORKER[:len(headers)]  # the given list is not changed

"""schemathesis against the OpenAPI document the app publishes, in-process with fakes at the seams: every
generated request to every operation gets a non-5xx answer in its documented status, type and shape."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis

from harness.fuzz import fuzz_schema
from infera.kv.tokenizer import PromptRenderer
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from tests.fakes import MODEL, FakeFleet, FakeTransport, kvd_stub, worker

TOKEN = "fuzz-admin-token"
EXAMPLES = 20  # per operation: 13 operations, under a minute


@pytest.fixture
def kvd_socket(tmp_path: Path) -> Iterator[str]:
    with kvd_stub(str(tmp_path / "kvd.sock")) as path:
        yield path


def test_every_published_operation_survives_generated_requests(kvd_socket: str) -> None:
    transport = FakeTransport(text="hello there")
    router = Router(FakeFleet(worker("w1"), worker("w2")), transport, None, PromptRenderer.byte_level(),
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=256 * 1024, strip_patterns=[])
    install_operations(app, router, strip_patterns=[], kvd_socket_path=kvd_socket, admin_token=TOKEN)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    report = fuzz_schema(schema, EXAMPLES, lambda case: case.call(), headers={"authorization": f"Bearer {TOKEN}"},
                         models=[MODEL])
    assert not report.failures, "\n".join(report.failures[:10])
    assert report.server_errors == 0
    operations = {op for op in app.openapi()["paths"]}
    assert len(report.by_operation) >= len(operations) >= 12
    # the generator reached the routing path, not only the validators
    assert report.statuses[200] > 20 and len(transport.calls) > 10, report.statuses
    assert MODEL in {c.body.get("model") for c in transport.calls}

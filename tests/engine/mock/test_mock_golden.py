"""The mock, configured like the golden vLLM 0.32 capture, publishes the same KV events byte for byte.

Same tokenizer (SmolLM2), block size 128, 40 blocks (block 0 is the null block), the same
/v1/completions requests one at a time and a prefix-cache reset: the same hashes, the same
evictions in the same order, the same batches and sequence numbers, the same replay. Only
each batch's timestamp (bytes 1..9 of the payload) differs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import zmq
from mock_harness import MockProcess, read_jsonl

from harness.zmq_sub import subscribe
from infera.protocols.kv_events import REPLAY_END_SEQ, decode_batch, seq_to_bytes

TS_END = 10  # payload = fixarray(3) marker + float64 ts (0xcb + 8 bytes)


def _frames(path: Path) -> list[list[bytes]]:
    return [[base64.b64decode(f) for f in row["frames_b64"]] for row in read_jsonl(path)]


def _same_but_ts(ours: bytes, theirs: bytes) -> bool:
    return ours[0] == theirs[0] == 0x93 and ours[1] == theirs[1] == 0xCB and ours[TS_END:] == theirs[TS_END:]


def _start_golden(start_mock: Callable[..., MockProcess], golden: Path) -> MockProcess:
    return start_mock("--model-path", str(golden / "tokenizer"), "--served-model-name", "smol",
                      "--block-size", "128", "--num-kv-blocks", "40", "--max-model-len", "2048",
                      "--speedup-ratio", "50")


def test_golden_event_stream_and_replay(start_mock: Callable[..., MockProcess], golden_dir: Path) -> None:
    mock = _start_golden(start_mock, golden_dir)
    kv = mock.record["kv_events"]
    ctx = zmq.Context()
    sub = subscribe(ctx, kv["endpoint"])
    try:
        with httpx.Client(base_url=mock.url, timeout=30) as client:
            for step in read_jsonl(golden_dir / "requests.jsonl"):
                req = step["request"]
                resp = client.request(req["method"], req["path"], json=req.get("body"))
                assert resp.status_code == 200, resp.text
                body = resp.json()
                if step["kind"] == "reset_prefix_cache":
                    assert body == {"success": True}
                    continue
                assert body["choices"][0]["prompt_token_ids"] == step["prompt_token_ids"], step["step"]
                assert body["usage"]["prompt_tokens"] == step["prompt_tokens"], step["step"]
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == step["cached_tokens"], step["step"]
                assert body["usage"]["completion_tokens"] == 4
        golden = _frames(golden_dir / "frames.jsonl")
        got: list[list[bytes]] = []
        while len(got) < len(golden) and sub.poll(5000):
            got.append(sub.recv_multipart())
        assert not sub.poll(200), "more batches than vLLM published"
        assert len(got) == len(golden)
        for i, (ours, theirs) in enumerate(zip(got, golden, strict=True)):
            assert ours[0] == theirs[0] == b"kv-events"
            assert ours[1] == theirs[1] == seq_to_bytes(i)
            assert _same_but_ts(ours[2], theirs[2]), (i, decode_batch(ours[2]), decode_batch(theirs[2]))

        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(kv["replay_endpoint"])
        exchange = json.loads((golden_dir / "replay_request.json").read_text())
        request = [base64.b64decode(f) for f in exchange["frames_b64"]]
        assert request == [b"", seq_to_bytes(2)]
        dealer.send_multipart(request)
        replayed: list[list[bytes]] = []
        while dealer.poll(5000):
            msg = dealer.recv_multipart()
            replayed.append(msg)
            if msg[2] == seq_to_bytes(REPLAY_END_SEQ):
                break
        want = _frames(golden_dir / "replay.jsonl")
        assert len(replayed) == len(want) == 11
        assert replayed[-1] == want[-1] == [b"", b"", b"\xff" * 8, b""]
        for ours, theirs in zip(replayed[:-1], want[:-1], strict=True):
            assert ours[:3] == theirs[:3]
            assert _same_but_ts(ours[3], theirs[3])
        dealer.close(0)
    finally:
        sub.close(0)
        ctx.term()
    assert mock.alive

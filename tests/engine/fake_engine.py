"""A stand-in for ``vllm``/``sglang`` in wrapper tests: records the argv the adapter built, then runs
the mock engine in-process with the equivalent mock flags.

``python tests/engine/fake_engine.py vllm|sglang <engine flags>``; env ``FAKE_ENGINE_ARGV`` names a
file to write the argv to (JSON), ``FAKE_ENGINE_EXIT_AFTER=<s>:<code>`` makes it exit on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def mock_argv(kind: str, argv: list[str]) -> list[str]:
    p = argparse.ArgumentParser()
    p.add_argument("--model" if kind == "vllm" else "--model-path", dest="model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--block-size" if kind == "vllm" else "--page-size", dest="block_size", type=int, default=16)
    p.add_argument("--max-num-seqs" if kind == "vllm" else "--max-running-requests", dest="max_seqs", type=int,
                   default=256)
    p.add_argument("--kv-events-config", default="")
    args, _ = p.parse_known_args(argv)
    out = ["--host", args.host, "--port", str(args.port), "--served-model-name", args.served_model_name or args.model,
           "--block-size", str(args.block_size), "--max-num-seqs", str(args.max_seqs), "--num-kv-blocks", "1024",
           "--speedup-ratio", "20", "--discovery-backend", "static", "--request-transport", "http",
           "--kv-event-transport", "zmq"]  # a plain engine: the wrapper does the registering
    if args.kv_events_config:
        config = json.loads(args.kv_events_config)
        out += ["--kv-events-port", config["endpoint"].rsplit(":", 1)[1],
                "--kv-events-topic", config.get("topic", "")]
        if config.get("replay_endpoint"):
            out += ["--kv-replay-port", config["replay_endpoint"].rsplit(":", 1)[1]]
    else:
        out += ["--no-kv-events"]
    return out


def main() -> None:
    kind, argv = sys.argv[1], sys.argv[2:]
    record = os.environ.get("FAKE_ENGINE_ARGV")
    if record:
        Path(record).write_text(json.dumps([kind, *argv]))
    exit_after = os.environ.get("FAKE_ENGINE_EXIT_AFTER")
    if exit_after:
        seconds, code = exit_after.split(":")
        threading.Timer(float(seconds), os._exit, (int(code),)).start()
    from infera.engine.mock.__main__ import main as mock_main

    mock_main(mock_argv(kind, argv))


if __name__ == "__main__":
    main()

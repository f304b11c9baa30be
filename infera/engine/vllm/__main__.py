"""``python -m infera.engine.vllm``: launch (or attach to) vLLM, register it, relay signals."""

from __future__ import annotations

import sys

from infera.engine.vllm.adapter import VllmAdapter
from infera.engine.wrapper import main

if __name__ == "__main__":
    sys.exit(main(VllmAdapter(), sys.argv[1:]))

"""``python -m infera.engine.sglang``: launch (or attach to) SGLang, register it, relay signals."""

from __future__ import annotations

import sys

from infera.engine.sglang.adapter import SglangAdapter
from infera.engine.wrapper import main

if __name__ == "__main__":
    sys.exit(main(SglangAdapter(), sys.argv[1:]))

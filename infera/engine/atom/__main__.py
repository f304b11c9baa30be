"""``python -m infera.engine.atom``: launch (or attach to) ATOM, register it, relay signals."""

from __future__ import annotations

import sys

from infera.engine.atom.adapter import AtomAdapter
from infera.engine.wrapper import main

if __name__ == "__main__":
    sys.exit(main(AtomAdapter(), sys.argv[1:]))

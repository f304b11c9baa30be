"""The whole reliability suite of issue 19 in one command: the fault matrix, the fuzzing and the soak.

    python -m bench.reliability                 # full: every fault x plane, fuzzing, a 30-minute soak
    python -m bench.reliability --soak-minutes 5

Each part runs as its own process (``python -m bench.faults``, ``bench.fuzz``, ``bench.soak``) and
prints its own table; their JSON goes to bench/results/. The exit status is the first failing part's
(the fault matrix fails on any lost, hung or leaked request). The faults pytest tier
(``./scripts/test -m faults``) is the short version CI runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="requests per fault-matrix cell")
    ap.add_argument("--examples", type=int, default=30, help="schemathesis cases per operation")
    ap.add_argument("--soak-minutes", type=float, default=30.0)
    args = ap.parse_args(argv)
    parts = [
        ("faults", ["-m", "bench.faults", "--requests", str(args.requests)]),
        ("fuzz", ["-m", "bench.fuzz", "--examples", str(args.examples)]),
        ("soak", ["-m", "bench.soak", "--minutes", str(args.soak_minutes)]),
    ]
    failed = 0
    for name, cmd in parts:
        started = time.monotonic()
        print(f"== {name}: python {' '.join(cmd)}", flush=True)
        rc = subprocess.call([sys.executable, *cmd])
        print(f"== {name}: exit {rc} after {time.monotonic() - started:.0f} s", flush=True)
        failed = failed or rc
    return failed


if __name__ == "__main__":
    sys.exit(main())

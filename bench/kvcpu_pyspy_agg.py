"""Aggregate a py-spy raw profile of bench/prompt_cpu_live.py by router policy (serving frames only).

    py-spy record --subprocesses --format raw -r 200 -o /tmp/live.txt -- \\
        .venv/bin/python bench/prompt_cpu_live.py --quick --routers "infera rr,infera kv" --no-install
    .venv/bin/python bench/kvcpu_pyspy_agg.py /tmp/live.txt kv-aware     # or round-robin
"""

from __future__ import annotations

import collections
import re
import sys


def main() -> None:
    path, want = sys.argv[1], sys.argv[2]
    incl: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            frames = stack.split(";")
            proc = [x for x in frames if x.startswith("process ")][-1]
            if want not in proc or "infera.server" not in proc:
                continue
            if "Server.run" not in stack and "Thread._bootstrap" not in stack:
                continue  # startup (imports, tokenizer load) is not per-request work
            total += n
            names = [re.sub(r":\d+\)", ")", x) for x in frames if not x.startswith("process ")]
            leaf[names[-1]] += n
            for name in set(names):
                incl[name] += n
    print(want, "serving samples", total)
    print("--- inclusive")
    for k, c in incl.most_common(70):
        if "infera" in k:
            print(f"{100 * c / total:5.1f}% {k}")
    print("--- self")
    for k, c in leaf.most_common(20):
        print(f"{100 * c / total:5.1f}% {k}")


if __name__ == "__main__":
    main()

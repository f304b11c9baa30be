"""The prompt stage's CPU per request vs prompt length and vs turn number, without and with
the prompt cache (infera.kv.prompt_cache), in one run.

Each request is the next turn of a conversation whose previous turn the router has just
seen (the multi-turn case): ``chat_token_ids`` (render + tokenize) then ``block_hashes``
(block 16), as the kv-aware router does. "before" is the same renderer with the prompt
cache bypassed (tiktoken's own per-segment cache stays on, as it was before); "after" has
it on. Conversations: a ~500-token system prompt, then user/assistant turns of ~150
tokens each, as many as the target length needs; "unique" times a single-turn prompt of
the same length, new text every time, that nothing can be reused for (the cold case).

CPU time of this process per request, median over repeats; every repeat starts from an
empty cache, warms it with each session's previous turn (untimed), then times the turn.

``baseline(ref)`` runs the same sweep on the infera code of git ``ref`` (exported to a
temp dir, in a subprocess), so the one run also has the figures from before this work.

    .venv/bin/python bench/prompt_sweep.py --infera-root DIR --json OUT   # used by baseline() and ab()
    .venv/bin/python bench/prompt_sweep.py --ab main --rounds 3 [--quick]  # git ref vs this tree, alternating
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PLOTS, PYTHON, REPO, _text, export_ref

BLOCK = 16
MIN_MESSAGES = 12  # infera.kv.render_cache.MIN_MESSAGES (this file also runs on code from before it)
PLAIN_MAX = 11  # infera.kv.plain_render.MAX_MESSAGES (likewise)
LENGTHS = (1000, 2000, 4000, 8000, 16000, 32000)
TURNS = (1, 2, 4, 8, 12, 16, 24, 32)
SESSIONS = 12


def _session(seed: int, turns: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "Rules:\n" + _text(rng, 400)}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: " + _text(rng, 60)})
        messages.append({"role": "assistant", "content": _text(rng, 60)})
    messages.append({"role": "user", "content": f"Turn {turns}: " + _text(rng, 60)})
    return messages


def _turns_for(renderer: Any, tokens: int) -> int:
    """Turns that make a ~``tokens``-token prompt (about 150 tokens a turn)."""
    lo, hi = 0, 1
    while len(renderer.chat_token_ids(_session(0, hi))) < tokens:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if len(renderer.chat_token_ids(_session(0, mid))) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return lo


Pairs = list[tuple[list[dict[str, str]], list[dict[str, str]]]]


def _time_turn(renderer: Any, cached: bool, sessions: Pairs | list[Pairs], repeats: int) -> dict[str, float]:
    """µs of CPU per request for the second list of each pair after the first was seen.

    ``sessions`` may be one list of pairs per repeat (prompts that must be new each time).
    """
    from infera.kv.hashing import block_hashes

    cache = getattr(renderer, "prompt_cache", None)  # None in code from before the cache
    renders = getattr(renderer, "render_caches", {})  # {} in code from before the render cache
    plains = getattr(renderer, "plain_recipes", {})  # {} in code from before the recipes
    per: list[float] = []
    render: list[float] = []
    per_repeat = sessions if isinstance(sessions[0], list) else [sessions] * repeats
    for rep in range(repeats):
        sessions = per_repeat[rep]
        if cache is not None:
            cache.clear()
            cache.min_chars = 0 if cached else 1 << 60
        for rc in renders.values():  # "cached" = both caches as configured, else neither
            rc.clear()
            rc.min_messages = MIN_MESSAGES if cached else 1 << 60
        for recipes in plains.values():  # and short chats of plain messages from recipes, or through jinja
            recipes.max_messages = PLAIN_MAX if cached else 0
        for prev, _cur in sessions:
            block_hashes(renderer.chat_token_ids(prev), BLOCK)
        gc.collect()
        gc.disable()
        t0 = time.process_time_ns()
        for _prev, cur in sessions:
            block_hashes(renderer.chat_token_ids(cur), BLOCK)
        t1 = time.process_time_ns()
        for rc in renders.values():  # the render alone, in the state the timed requests found
            rc.clear()
        for prev, _cur in sessions:
            renderer.render_chat(prev)
        t1b = time.process_time_ns()
        for _prev, cur in sessions:
            renderer.render_chat(cur)
        t2 = time.process_time_ns()
        gc.enable()
        per.append((t1 - t0) / len(sessions) / 1e3)
        render.append((t2 - t1b) / len(sessions) / 1e3)
    return {"us": statistics.median(per), "render_us": statistics.median(render)}


def run(renderer: Any, quick: bool = False) -> dict[str, Any]:
    repeats = 3 if quick else 5
    lengths = LENGTHS[:4] if quick else LENGTHS
    turns = TURNS[:5] if quick else TURNS
    by_length: list[dict[str, Any]] = []
    for target in lengths:
        n = _turns_for(renderer, target)
        pairs = [(_session(s, max(n - 1, 0)), _session(s, n)) for s in range(SESSIONS)]
        unique = [[([{"role": "user", "content": "x"}],  # new text every repeat: nothing cached anywhere
                    [{"role": "user", "content": _text(random.Random(f"{target}-{rep}-{s}"), int(target / 1.2))}])
                   for s in range(SESSIONS)] for rep in range(2 * repeats)]
        row = {"target_tokens": target, "tokens": len(renderer.chat_token_ids(pairs[0][1])), "turns": n,
               "before": _time_turn(renderer, False, pairs, repeats),
               "after": _time_turn(renderer, True, pairs, repeats),
               "unique_before": _time_turn(renderer, False, unique[:repeats], repeats),
               "unique_after": _time_turn(renderer, True, unique[repeats:], repeats)}
        by_length.append(row)
    by_turn: list[dict[str, Any]] = []
    for t in turns:
        pairs = [(_session(s, t - 1), _session(s, t)) for s in range(SESSIONS)]
        by_turn.append({"turn": t, "tokens": len(renderer.chat_token_ids(pairs[0][1])),
                        "before": _time_turn(renderer, False, pairs, repeats),
                        "after": _time_turn(renderer, True, pairs, repeats)})
    return {"by_length": by_length, "by_turn": by_turn, "sessions": SESSIONS, "repeats": repeats,
            "block_size": BLOCK}


def baseline(ref: str, tok: Path, quick: bool) -> dict[str, Any]:
    """The sweep on infera as of git ``ref`` (its "before" column: no cache, old render)."""
    with tempfile.TemporaryDirectory(prefix="infera-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "infera"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "sweep.json"
        subprocess.run([PYTHON, str(Path(__file__).resolve()), "--infera-root", tmp, "--tokenizer", str(tok),
                        "--json", str(out), *(["--quick"] if quick else [])], check=True)
        res: dict[str, Any] = json.loads(out.read_text())
        res["ref"] = ref
        return res


def merge(now: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``now`` with the baseline's cache-off figures as "base" in every row."""
    for rows, key in (("by_length", "target_tokens"), ("by_turn", "turn")):
        old = {r[key]: r for r in base[rows]}
        for r in now[rows]:
            if r[key] in old:
                r["base"] = old[r[key]]["before"]
                r["unique_base"] = old[r[key]].get("unique_before")
    now["baseline_ref"] = base.get("ref")
    return now


def print_report(res: dict[str, Any]) -> None:
    nan = {"us": float("nan"), "render_us": float("nan")}
    print(f"prompt stage (render + tokenize + hash) per request, CPU µs; next turn of a conversation. "
          f"before = {res.get('baseline_ref', '?')}; no-cache = this code, prompt cache off; after = cache on")
    print(f"{'tokens':>7}{'turns':>6}{'before':>9}{'no-cache':>9}{'after':>9}{'ratio':>7}{'render':>8}"
          f"{'unique: before':>16}{'after':>7}")
    for r in res["by_length"]:
        b = r.get("base") or nan
        ub = r.get("unique_base") or nan
        print(f"{r['tokens']:>7}{r['turns']:>6}{b['us']:>9.0f}{r['before']['us']:>9.0f}{r['after']['us']:>9.0f}"
              f"{b['us'] / r['after']['us']:>6.1f}x{r['after']['render_us']:>8.0f}"
              f"{ub['us']:>16.0f}{r['unique_after']['us']:>7.0f}")
    print(f"{'turn':>7}{'tokens':>7}{'before':>9}{'no-cache':>9}{'after':>9}{'ratio':>7}{'render':>8}")
    for r in res["by_turn"]:
        b = r.get("base") or nan
        print(f"{r['turn']:>7}{r['tokens']:>7}{b['us']:>9.0f}{r['before']['us']:>9.0f}{r['after']['us']:>9.0f}"
              f"{b['us'] / r['after']['us']:>6.1f}x{r['after']['render_us']:>8.0f}")


def plot(res: dict[str, Any], out: Path = PLOTS / "prompt_cpu.png") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["tokens"] for r in res["by_length"]]
    for key, label in (("base", "before"), ("before", "render fixes, no prompt cache"),
                       ("after", "after (prompt cache)")):
        if all(key in r for r in res["by_length"]):
            a.plot(xs, [r[key]["us"] for r in res["by_length"]], marker="o", label=label)
    a.plot(xs, [r["after"]["render_us"] for r in res["by_length"]], ls="--", label="of which render")
    a.plot(xs, [r["unique_after"]["us"] for r in res["by_length"]], ls=":", label="unique prompt (no reuse)")
    a.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="CPU µs per request",
          title="next turn vs prompt length")
    ts = [r["turn"] for r in res["by_turn"]]
    for key, label in (("base", "before"), ("before", "no prompt cache"), ("after", "after")):
        if all(key in r for r in res["by_turn"]):
            b.plot(ts, [r[key]["us"] for r in res["by_turn"]], marker="o", label=label)
    b.plot(ts, [r["after"]["render_us"] for r in res["by_turn"]], ls="--", label="of which render")
    b.set(xlabel="turn", ylabel="CPU µs per request", title="growing conversation (~150 tokens a turn)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def ab(ref: str, tok: Path, quick: bool, rounds: int) -> dict[str, Any]:
    """The sweep on git ``ref`` and on this tree, in alternating subprocesses (``rounds`` each); per cell the
    median over rounds. The ref's tree runs its own C extensions (``export_ref``)."""
    runs: dict[str, list[dict[str, Any]]] = {"ref": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="infera-ab-") as tmp:
        export_ref(ref, Path(tmp))
        for r in range(rounds):
            for side, root in (("ref", Path(tmp)), ("this", REPO)) if r % 2 == 0 else (("this", REPO),
                                                                                      ("ref", Path(tmp))):
                out = Path(tmp) / f"{side}-{r}.json"
                subprocess.run([PYTHON, str(Path(__file__).resolve()), "--infera-root", str(root), "--tokenizer",
                                str(tok), "--json", str(out), *(["--quick"] if quick else [])], check=True)
                runs[side].append(json.loads(out.read_text()))
    def cell(side: str, rows: str, i: int, col: str, key: str) -> float:
        return statistics.median(run[rows][i][col][key] for run in runs[side])
    res: dict[str, Any] = {"ref": ref, "rounds": rounds, "by_length": [], "by_turn": []}
    for rows in ("by_length", "by_turn"):
        for i, row in enumerate(runs["this"][0][rows]):
            out_row = {k: v for k, v in row.items() if not isinstance(v, dict)}
            for side in ("ref", "this"):
                for col in ("before", "after", "unique_after") if rows == "by_length" else ("before", "after"):
                    out_row[f"{side}_{col}"] = {k: cell(side, rows, i, col, k) for k in ("us", "render_us")}
            res[rows].append(out_row)
    return res


def print_ab(res: dict[str, Any]) -> None:
    print(f"prompt stage per request, CPU us, next turn; {res['ref']} vs this tree, both caches on; "
          f"medians of {res['rounds']} alternating subprocess rounds; no-cache = this tree, both caches off")
    print("| prompt tokens | turns | ref | this | this/ref | this, no cache | render: ref | this "
          "| unique: ref | this |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in res["by_length"]:
        a, b = r["ref_after"], r["this_after"]
        print(f"| {r['tokens']} | {r['turns']} | {a['us']:.0f} | {b['us']:.0f} | {b['us'] / a['us']:.2f}x "
              f"| {r['this_before']['us']:.0f} | {a['render_us']:.0f} | {b['render_us']:.0f} "
              f"| {r['ref_unique_after']['us']:.0f} | {r['this_unique_after']['us']:.0f} |")
    print("| turn | prompt tokens | ref | this | this/ref | this, no cache | render: ref | this |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in res["by_turn"]:
        a, b = r["ref_after"], r["this_after"]
        print(f"| {r['turn']} | {r['tokens']} | {a['us']:.0f} | {b['us']:.0f} | {b['us'] / a['us']:.2f}x "
              f"| {r['this_before']['us']:.0f} | {a['render_us']:.0f} | {b['render_us']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--infera-root", type=Path, help="run the sweep on this tree's infera/ (a subprocess of --ab)")
    ap.add_argument("--ab", metavar="REF", help="git ref against this tree, alternating subprocesses")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.ab:
        from bench.common import default_tokenizer_dir, write_results

        res = ab(args.ab, args.tokenizer or default_tokenizer_dir(), args.quick, args.rounds)
        print_ab(res)
        print(f"results: {write_results('prompt_sweep_ab', res)}")
        return
    sys.path.insert(0, str(args.infera_root))
    from infera.kv.tokenizer import PromptRenderer

    renderer = PromptRenderer.from_dir(args.tokenizer)
    args.json.write_text(json.dumps(run(renderer, quick=args.quick)))


if __name__ == "__main__":
    main()

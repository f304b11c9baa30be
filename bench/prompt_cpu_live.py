"""Router CPU per request vs prompt length (and so turn number), live: infera and the peers, one run.

Four mock engines at a huge speedup (engine time negligible) behind each router in turn: infera
round-robin and kv-aware, sglang-router round_robin and cache_aware, vllm-router round_robin and
cache_aware (bench/peers.py; a peer that cannot be installed is left out with the reason). For
each target length (1k-32k Qwen tokens) the conversations of bench/prompt_sweep.py (a ~500-token
system prompt, then ~150-token turns, as many as the length needs) are sent as a chat client
sends them: each session's turn t (not timed), then turns t+1 .. t+k, each extending the one
before, non-streamed, ``max_tokens`` 8, 4 in flight. CPU = the router process's utime+stime over
the timed turns / their count. Routers are started fresh per length, in rotating order, on the
same engines.

    .venv/bin/python bench/prompt_cpu_live.py            # ~10 min;  --quick: 3 lengths, fewer turns
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers
from bench.common import (
    PLOTS,
    Proc,
    default_tokenizer_dir,
    frontend,
    frontend_ready,
    machine_info,
    make_session,
    mock_engine,
    run_load,
    stop_all,
    write_results,
)
from bench.conversations import chat_body_from
from bench.prompt_sweep import LENGTHS, _session, _turns_for

MODEL = "bench-model"
ROUTERS = {"infera rr": ("infera", "round-robin"), "infera kv": ("infera", "kv-aware"),
           "sgl rr": ("sglang-router", "round_robin"), "sgl ca": ("sglang-router", "cache_aware"),
           "vllm rr": ("vllm-router", "round_robin"), "vllm ca": ("vllm-router", "cache_aware")}


def _bodies(turn: int, sessions: int, steps: int) -> tuple[list[bytes], list[bytes]]:
    """(warm-up: each session's turn ``turn``, timed: turns turn+1..turn+steps, in turn order)."""
    warm = [chat_body_from(_session(s, turn), MODEL, False, 8) for s in range(sessions)]
    timed = [chat_body_from(_session(s, turn + k), MODEL, False, 8)
             for k in range(1, steps + 1) for s in range(sessions)]
    return warm, timed


def _start(name: str, engines: list[Proc], tok: Path, log_dir: Path, peer_set: dict[str, Any]) -> Proc:
    kind, policy = ROUTERS[name]
    if kind == "infera":
        proc = frontend(name.replace(" ", "-"), tok, policy, engines, log_dir).start()
        proc.wait_ready("/health", 90, frontend_ready(len(engines)))
        return proc
    proc = peers.router(peer_set[kind], policy, [e.url for e in engines], log_dir, tok, name.replace(" ", "-"))
    proc.start()
    peers.wait_ready(proc, len(engines))
    return proc


async def _measure(proc: Proc, warm: list[bytes], timed: list[bytes]) -> dict[str, float]:
    url = [proc.url + "/v1/chat/completions"]
    async with make_session(8) as session:
        res = await run_load(session, url, warm, 4, len(warm), 120.0)
        if res.errors:
            raise RuntimeError(f"warm-up errors: {res.first_error}")
        cpu0 = proc.cpu()
        res = await run_load(session, url, timed, 4, len(timed), 300.0)
        cpu = proc.cpu() - cpu0
    if res.errors:
        raise RuntimeError(f"{res.errors} errors: {res.first_error}")
    return {"cpu_us_per_req": cpu / max(res.ok, 1) * 1e6, "ok": res.ok, "rps": res.rps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4, help="timed turns per session and length")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--no-install", action="store_true")
    args = ap.parse_args()
    from infera.kv.tokenizer import PromptRenderer

    tok = default_tokenizer_dir()
    renderer = PromptRenderer.from_dir(str(tok))
    lengths = (1000, 4000, 16000) if args.quick else LENGTHS
    steps = 2 if args.quick else args.steps
    names = [n for n in args.routers.split(",") if n]
    peer_set = peers.ensure_all(install=not args.no_install)
    skipped = {n: peer_set[ROUTERS[n][0]].error for n in names
               if ROUTERS[n][0] in peer_set and not peer_set[ROUTERS[n][0]].ok}
    names = [n for n in names if n not in skipped]
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-prompt-live-"))
    extra = ["--num-kv-blocks", "65536", "--max-model-len", "65536"]
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir, 100000.0, extra) for i in range(4)]
    rows: list[dict[str, Any]] = []
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        for li, length in enumerate(lengths):
            turn = _turns_for(renderer, length)
            warm, timed = _bodies(turn, args.sessions, steps)
            tokens = len(renderer.chat_token_ids(_session(0, turn + 1)))
            order = names[li % len(names):] + names[:li % len(names)]
            for name in order:
                proc = _start(name, engines, tok, log_dir, peer_set)
                try:
                    m = asyncio.run(_measure(proc, warm, timed))
                finally:
                    stop_all([proc])
                rows.append({"router": name, "target": length, "tokens": tokens, "turn": turn + 1, **m})
                print(f"{length:>6} tokens ~{tokens:>6} turn {turn + 1:>4}  {name:<10} "
                      f"{m['cpu_us_per_req']:>8.0f} µs/req  {m['rps']:.0f} req/s", flush=True)
    finally:
        stop_all(engines)
    res = {"machine": machine_info(), "args": vars(args), "skipped": skipped, "rows": rows,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print_table(res)
    print(f"plot: {plot(res)}")
    print(f"results: {write_results('prompt_cpu_live', res)}")


def print_table(res: dict[str, Any]) -> None:
    rows = res["rows"]
    names = list(dict.fromkeys(r["router"] for r in rows))
    targets = sorted({r["target"] for r in rows})
    print("| prompt tokens | turn | " + " | ".join(names) + " | kv / sgl ca | rr / sgl rr |")
    print("|--:|--:|" + "--:|" * len(names) + "--:|--:|")
    for t in targets:
        by = {r["router"]: r for r in rows if r["target"] == t}
        any_row = next(iter(by.values()))
        cells = [f"{by[n]['cpu_us_per_req']:.0f}" if n in by else "–" for n in names]

        def ratio(a: str, b: str, by: dict[str, Any] = by) -> str:
            return f"{by[a]['cpu_us_per_req'] / by[b]['cpu_us_per_req']:.2f}×" if a in by and b in by else "–"

        print(f"| {any_row['tokens']} | {any_row['turn']} | " + " | ".join(cells)
              + f" | {ratio('infera kv', 'sgl ca')} | {ratio('infera rr', 'sgl rr')} |")
    if res["skipped"]:
        print("skipped: " + "; ".join(f"{k}: {v}" for k, v in res["skipped"].items()))


def plot(res: dict[str, Any], out: Path = PLOTS / "prompt_cpu_live.png") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
    names = list(dict.fromkeys(r["router"] for r in res["rows"]))
    for k, name in enumerate(names):
        pts = sorted((r["tokens"], r["cpu_us_per_req"], r["turn"]) for r in res["rows"] if r["router"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{k}", label=name,
                ls="-" if name.startswith("infera") else "--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (next turn of a conversation; turn = tokens / ~150)")
    ax.set_ylabel("router CPU µs / request")
    ax.legend(fontsize=8)
    m = res["machine"]
    ax.set_title(f"router CPU per request vs prompt length, live, 4 mock engines\n{m['nproc']} cores, "
                 f"{res['date']}", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()

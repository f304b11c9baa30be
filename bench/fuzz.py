"""API fuzzing and hostile input against a live fleet (issue 19, part 2).

    python -m bench.fuzz --examples 30 --half-open 1000

Starts two mock engines (one serving a KV-daemon socket, both with a profiler) and a frontend with
the admin token, profiling and prewarm on, then runs, in order: schemathesis over the frontend's
own ``/openapi.json`` (every operation, ``--examples`` generated cases each, checked against the
document: status, content type, headers, response schema, and no 5xx); ``--rounds`` rounds of the
hostile-body catalogue (``harness.fuzz``); 10 MB bodies; a huge prompt; slow-drip headers and body;
``--half-open`` concurrent half-open connections. A bystander client sends ordinary requests
throughout; the frontend's RSS and open fds are sampled. Prints a table and writes
``bench/results/fuzz-*.json``. Everything on 127.0.0.1; every loop bounded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import schemathesis

from bench.common import default_tokenizer_dir, machine_info, write_results
from bench.fuzz_hostile import Bystander, Sampler, half_open, hostile_round, huge_prompt, slowloris, ten_mb
from harness import Process, start_frontend, start_mock
from harness.fuzz import fuzz_schema

MODEL = "Qwen/Qwen3-0.6B"
TOKEN = "bench-fuzz-admin-token"
HEADER_TIMEOUT, BODY_TIMEOUT = 5.0, 5.0  # the bench's deadlines: short, so the slow phases end soon


def start(tmp: Path, tokenizer: Path) -> tuple[list[Process], Process]:
    sock = str(tmp / "kvd.sock")
    mock_args = ("--block-size", "16", "--num-kv-blocks", "4096", "--speedup-ratio", "50", "--log-level", "warning")
    mocks = [start_mock(tmp, model=MODEL, model_path=tokenizer,
                        args=(*mock_args, "--profile-dir", str(tmp / f"profiles-{i}"),
                              *(("--kvd-socket-path", sock) if i == 0 else ()))) for i in range(2)]
    front = start_frontend(tmp, mocks, tokenizer=tokenizer, args=(
        "--admin-token", TOKEN, "--enable-profiling", "--kvd-socket-path", sock, "--log-level", "warning",
        "--client-header-timeout", str(HEADER_TIMEOUT), "--client-body-timeout", str(BODY_TIMEOUT)))
    return mocks, front


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="infera-fuzz-"))
    mocks, front = start(tmp, default_tokenizer_dir())
    port = int(front.url.rsplit(":", 1)[1])
    out: dict[str, Any] = {"machine": machine_info(), "command": " ".join(["python -m bench.fuzz", *sys.argv[1:]]),
                           "deadlines_s": {"header": HEADER_TIMEOUT, "body": BODY_TIMEOUT}, "logs": str(tmp)}
    try:
        with Sampler(front.pid) as sampler, Bystander(front.url, MODEL) as bystander, \
                Bystander(front.url, MODEL, probe=True) as prober:
            def phase(name: str) -> None:
                sampler.phase = bystander.phase = prober.phase = name
                print(f"[fuzz] {name}: RSS {sampler.now()[0]:.0f} MB, fds {sampler.now()[1]}", flush=True)

            out["rss_mb_start"], out["fds_start"] = sampler.now()
            phase("schemathesis")
            schema = schemathesis.openapi.from_url(front.url + "/openapi.json")
            started = time.monotonic()
            report = fuzz_schema(schema, args.examples, lambda case: case.call(base_url=front.url, timeout=60),
                                 headers={"authorization": f"Bearer {TOKEN}"}, models=[MODEL])
            out["schemathesis"] = {"cases": report.cases, "operations": len(report.by_operation),
                                   "statuses": dict(sorted(report.statuses.items())),
                                   "server_errors": report.server_errors, "failures": report.failures[:20],
                                   "failed": len(report.failures), "seconds": round(time.monotonic() - started, 1)}
            out["rss_mb_after_schemathesis"] = sampler.now()[0]
            out["hostile"] = []
            for r in range(args.rounds):
                phase(f"hostile-{r + 1}")
                result = hostile_round(front.url, MODEL, TOKEN, args.huge_chars)
                result["rss_mb_after"] = sampler.now()[0]
                out["hostile"].append(result)
            phase("10mb")
            out["ten_mb"] = ten_mb(front.url, TOKEN)
            phase("huge-prompt")
            out["huge_prompt"] = huge_prompt(front.url, MODEL, args.huge_prompt_mb)
            out["rss_mb_after_huge"] = [sampler.now()[0]]
            for _ in range(args.huge_repeats - 1):  # is what a huge prompt leaves behind bounded?
                huge_prompt(front.url, MODEL, args.huge_prompt_mb)
                out["rss_mb_after_huge"].append(sampler.now()[0])
            phase("slowloris")
            out["slowloris"] = slowloris(port, MODEL, bound=HEADER_TIMEOUT + BODY_TIMEOUT + 30)
            phase("half-open")
            out["half_open"] = vars(half_open(port, front.pid, args.half_open, bound=HEADER_TIMEOUT + 30))
            phase("settle")
            time.sleep(2)  # the bystander's requests after everything: the fleet serves as before
            out["rss_mb_end"], out["fds_end"] = sampler.now()
            out["rss_mb_peak"] = max(s[2] for s in sampler.samples)
            out["bystander"] = {p: bystander.summary(p) for p in dict.fromkeys(r[0] for r in bystander.results)}
            out["bystander"]["all"] = bystander.summary()
            out["livez"] = {p: prober.summary(p) for p in dict.fromkeys(r[0] for r in prober.results)}
            out["livez"]["all"] = prober.summary()
        out["frontend_alive"] = front.alive()
    finally:
        front.stop()
        for m in mocks:
            m.stop()
    return out


def table(out: dict[str, Any]) -> str:
    st, hs, tm, hp = out["schemathesis"], out["hostile"], out["ten_mb"], out["huge_prompt"]
    sl, ho, by, lz = out["slowloris"], out["half_open"], out["bystander"], out["livez"]
    fives = st["server_errors"] + sum(sum(n for s, n in h["statuses"].items() if int(s) >= 500) for h in hs)
    rows = [
        ("schemathesis", f"{st['cases']} cases over {st['operations']} operations, {st['server_errors']} 5xx, "
                         f"{st['failed']} check failures, statuses {st['statuses']}"),
        *[(f"hostile round {i + 1}", f"{h['kinds']} kinds x endpoints = {h['cases']} cases, statuses {h['statuses']}, "
                                     f"{len(h['wrong'])} not in the API's shape; RSS after {h['rss_mb_after']:.0f} MB")
          for i, h in enumerate(hs)],
        ("10 MB bodies", f"{tm['413']}/{tm['cases']} answered 413 ({len(tm['wrong'])} otherwise)"),
        (f"{hp['prompt_mb']} MB prompt", f"chat {hp['chat']['status']} in {hp['chat']['seconds']} s, count_tokens "
                                         f"{hp['count_tokens']['status']} in {hp['count_tokens']['seconds']} s; "
                                         f"bystander meanwhile p99 {by.get('huge-prompt', {}).get('p99_ms')} ms, "
                                         f"max {by.get('huge-prompt', {}).get('max_ms')} ms; RSS after each of "
                                         f"{len(out['rss_mb_after_huge'])}: "
                                         f"{', '.join(f'{r:.0f}' for r in out['rss_mb_after_huge'])} MB"),
        ("slow-drip headers", f"{sl['headers']['answer']} after {sl['headers']['seconds']} s"),
        ("slow-drip body", f"{sl['body']['status']} after {sl['body']['seconds']} s"),
        (f"{ho['opened']} half-open connections", f"{ho['closed_by_server']} closed by the server within "
                                                  f"{ho['seconds_to_close']} s; fds {ho['fds_before']} -> peak "
                                                  f"{ho['fds_peak']} -> {ho['fds_after']}"),
        ("bystander (all phases)", f"{by['all']['requests']} requests, {by['all']['failed']} failed, p50 "
                                   f"{by['all']['p50_ms']} ms, p99 {by['all']['p99_ms']} ms, max "
                                   f"{by['all']['max_ms']} ms"),
        ("frontend's own /livez (all phases)", f"{lz['all']['requests']} probes, {lz['all']['failed']} failed, p50 "
                                               f"{lz['all']['p50_ms']} ms, p99 {lz['all']['p99_ms']} ms, max "
                                               f"{lz['all']['max_ms']} ms"),
        ("frontend memory", f"RSS {out['rss_mb_start']:.0f} MB at start -> {out['rss_mb_after_schemathesis']:.0f} "
                            f"after schemathesis -> peak {out['rss_mb_peak']:.0f} -> {out['rss_mb_end']:.0f} at end; "
                            f"fds {out['fds_start']} -> {out['fds_end']}"),
        ("5xx in all", str(fives)),
    ]
    return "\n".join(["| phase | result |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=30, help="schemathesis cases per operation")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the hostile catalogue (memory growth)")
    parser.add_argument("--huge-chars", type=int, default=2 << 20, help="length of the catalogue's huge strings")
    parser.add_argument("--huge-prompt-mb", type=float, default=7.0, help="the huge prompt's size (under 8 MiB)")
    parser.add_argument("--huge-repeats", type=int, default=3, help="huge prompts sent (RSS after each)")
    parser.add_argument("--half-open", type=int, default=1000, help="concurrent half-open connections")
    args = parser.parse_args()
    out = run(args)
    path = write_results("fuzz", out)
    print(table(out))
    for h in out["hostile"]:
        for line in h["wrong"][:20]:
            print("  not shaped:", line)
        print("  slowest hostile cases (s, kind, path, status):", h["slowest"][:5])
    for name, rows in (("bystander", out["bystander"]), ("livez", out["livez"])):
        print(f"  {name} by phase:", {p: (r["p99_ms"], r["max_ms"]) for p, r in rows.items()})
    for line in out["schemathesis"]["failures"][:10]:
        print("  schemathesis:", line[:400])
    print(f"results: {path}")


if __name__ == "__main__":
    main()

"""A short tour of a running infera fleet: conversations that share prefixes, and where they went.

Usage: .venv/bin/python scripts/tour.py [--base-url http://127.0.0.1:8000/v1]

Three conversations, each with its own long system prompt, take turns. KV-aware routing
should send every turn of a conversation to the worker that already holds its prefix
(cached prompt tokens grow turn by turn), while different conversations spread out.
"""

from __future__ import annotations

import argparse
import random

from openai import OpenAI

TOPICS = ("a lighthouse keeper", "a deep-sea survey", "an orbital greenhouse")
WORDS = ("harbor copper signal lantern north tide winter ledger quiet engine field orbit "
         "pressure sample valve garden light record storm ration shift crew archive").split()


def system_prompt(topic: str, seed: int) -> str:
    rng = random.Random(seed)
    notes = " ".join(rng.choice(WORDS) for _ in range(400))
    return f"You are the logbook assistant of {topic}. Keep answers short. Field notes follow. {notes}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id
    chats = [[{"role": "system", "content": system_prompt(t, i)}] for i, t in enumerate(TOPICS)]
    print(f"model {model}; {len(TOPICS)} conversations x {args.turns} turns\n")
    print(f"{'conversation':<24} {'turn':>4}  {'worker':<22} {'prompt tok':>10} {'cached tok':>10}")
    for turn in range(1, args.turns + 1):
        for topic, messages in zip(TOPICS, chats, strict=True):
            messages.append({"role": "user", "content": f"Entry {turn}: what changed since the last entry?"})
            raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=24)
            reply = raw.parse()
            usage = reply.usage
            cached = 0
            if usage and usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens:
                cached = usage.prompt_tokens_details.cached_tokens
            worker = raw.headers.get("x-infera-worker", "?")
            prompt = usage.prompt_tokens if usage else 0
            print(f"{topic:<24} {turn:>4}  {worker:<22} {prompt:>10} {cached:>10}")
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    print("\nEach conversation should stay on one worker, with most of its prompt cached after turn 1.")


if __name__ == "__main__":
    main()

"""Long multi-turn chat conversations for the data-path benches (profile, routing CPU).

Session ``s`` has a system prompt shared with its group (4 groups, ~1.5k Qwen tokens),
then alternating user/assistant turns of ~200 tokens each, so turn ``t``'s prompt is
about 1.5k + 400 t tokens. ``conversation(s, t)`` is the message list of turn ``t``
(0-based): every turn extends the previous one by the assistant's reply and a new user
message, as a chat client sends it.
"""

from __future__ import annotations

import json
import random
from typing import Any

from bench.common import _text

GROUPS = 4


def conversation(session: int, turn: int, seed: int = 5) -> list[dict[str, str]]:
    shared = random.Random(seed * 1_000_003 + session % GROUPS)
    system = (f"You are the assistant of team {session % GROUPS}. Rules follow.\n"
              + "\n".join(f"{k + 1}. {_text(shared, 50)}" for k in range(22)))
    own = random.Random(seed * 7_919 + session)
    messages = [{"role": "system", "content": system}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"Turn {t}: " + _text(own, 150)})
        if t < turn:
            messages.append({"role": "assistant", "content": _text(own, 150)})
    return messages


def multi_turn_conversation(session: int, turns: int) -> list[list[dict[str, str]]]:
    """The message lists of turns 0..turns-1 of one session."""
    return [conversation(session, t) for t in range(turns)]


def long_prompt(n_words: int, seed: int = 3) -> list[dict[str, str]]:
    """A single-turn conversation of about ``n_words`` * 1.2 Qwen tokens (no reuse possible)."""
    rng = random.Random(seed)
    return [{"role": "system", "content": "You summarise."}, {"role": "user", "content": _text(rng, n_words)}]


def chat_body_from(messages: list[dict[str, str]], model: str, stream: bool, max_tokens: int) -> bytes:
    payload: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                               "temperature": 0.0, "stream": stream}
    return json.dumps(payload, separators=(",", ":")).encode()

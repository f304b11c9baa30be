"""The nonce strip's shortcut (skip the regex when its literal start is absent) never changes a result."""

from __future__ import annotations

import random
import re

import pytest

from infera.config.server import BILLING_HEADER_PATTERN
from infera.protocols.nonces import required_literal, strip_text

PATTERNS = [BILLING_HEADER_PATTERN, r"(?m)^nonce:[^\n]*\n?", r"\Asession=\d+;", r"abc?d", r"(?i)^x-billing:.*",
            r"ab*c", r"[0-9a-f]{8}", r"(?m)^x-a:\s*\w+$", r"cch=[0-9a-f]+;"]
PIECES = ["x-anthropic-billing-header: cc_version=1.0; cch=deadbeef;\n", "nonce: 42\n", "session=17;", "abd",
          "abcd", "X-BILLING: yes", "ac", "abbbc", "0123abcd", "x-a: word", "hello world\n", "\n", "x-anthropic",
          "billing-header:", "cch=00;"]


def test_the_literal_start_of_a_pattern() -> None:
    assert required_literal(re.compile(BILLING_HEADER_PATTERN)) == "x-anthropic-billing-header:"
    assert required_literal(re.compile(r"abc?d")) is None  # "ab" is too short to be worth it
    assert required_literal(re.compile(r"(?i)^x-billing:.*")) is None
    assert required_literal(re.compile(r"[0-9a-f]{8}")) is None
    assert required_literal(re.compile(r"cch=[0-9a-f]+;")) == "cch="


@pytest.mark.parametrize("seed", range(200))
def test_strip_text_equals_every_regex_applied(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
    patterns = [re.compile(p) for p in rng.sample(PATTERNS, rng.randint(1, 4))]
    expected = text
    for p in patterns:
        expected = p.sub("", expected)
    assert strip_text(text, patterns) == expected

"""How long a simulated scheduler step takes (the constants NVIDIA Dynamo's mocker publishes).

prefill ms = a*T^2 + b*T + c for T uncached prompt tokens in the step;
decode ms = a*u^2 + b*u + c for KV usage fraction u, floored at 1 ms.
A step that both prefills and decodes costs the sum. Everything is divided by the speedup ratio.
"""

from __future__ import annotations

import dataclasses

from infera.config.engine import MockEngineSettings

DECODE_FLOOR_MS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class StepTimeModel:
    prefill: tuple[float, float, float] = (4.21e-7, 0.0152, 16.5)
    decode: tuple[float, float, float] = (-25.74, 54.01, 5.74)
    speedup_ratio: float = 1.0

    @classmethod
    def from_settings(cls, s: MockEngineSettings) -> StepTimeModel:
        return cls(
            prefill=(s.prefill_quadratic, s.prefill_linear, s.prefill_constant),
            decode=(s.decode_quadratic, s.decode_linear, s.decode_constant),
            speedup_ratio=s.speedup_ratio,
        )

    def prefill_ms(self, tokens: int) -> float:
        a, b, c = self.prefill
        return max(0.0, a * tokens * tokens + b * tokens + c)

    def decode_ms(self, kv_usage: float) -> float:
        a, b, c = self.decode
        return max(DECODE_FLOOR_MS, a * kv_usage * kv_usage + b * kv_usage + c)

    def step_seconds(self, prefill_tokens: int, decode_rows: int, kv_usage: float) -> float:
        """Wall time of one step in seconds, after the speedup ratio."""
        ms = 0.0
        if prefill_tokens:
            ms += self.prefill_ms(prefill_tokens)
        if decode_rows:
            ms += self.decode_ms(kv_usage)
        return ms / 1000.0 / self.speedup_ratio

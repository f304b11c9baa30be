"""Prometheus metrics under vLLM's names, so dashboards and other routers read the mock like vLLM.

Gauges are read from the engine at scrape time; counters and histograms are fed as requests
progress. One registry per engine (no module globals).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class EngineMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["model_name", "engine"]
        values = (model_name, "0")
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 = 100 percent.", labels, registry=r)
        self._queries = Counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.", labels, registry=r)
        self._hits = Counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.", labels, registry=r)
        self._preempt = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels, registry=r)
        self._prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self._gen = Counter("vllm:generation_tokens", "Generation tokens processed.", labels, registry=r)
        self._success = Counter("vllm:request_success", "Finished requests.", [*labels, "finished_reason"],
                                registry=r)
        ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                         buckets=TTFT_BUCKETS, registry=r)
        e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                        buckets=E2E_BUCKETS, registry=r)
        self.running, self.waiting, self.kv_usage = (g.labels(*values) for g in (self.running, self.waiting,
                                                                                 self.kv_usage))
        self.queries, self.hits, self.preempt = (c.labels(*values) for c in (self._queries, self._hits, self._preempt))
        self.prompt_tokens, self.generation_tokens = self._prompt.labels(*values), self._gen.labels(*values)
        self.ttft, self.e2e = ttft.labels(*values), e2e.labels(*values)
        self._values = values

    def finished(self, reason: str, prompt_tokens: int, generation_tokens: int, e2e_seconds: float) -> None:
        self._success.labels(*self._values, reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.e2e.observe(e2e_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""A simulated LLM engine (``python -m infera.engine.mock``), faithful enough that routing benchmarks mean something.

Modules: ``hashing`` (vLLM's block hash), ``cache`` (paged KV blocks, prefix caching, vLLM's
free-queue order), ``sequence`` + ``scheduler`` (continuous batching, chunked prefill,
preemption), ``timing`` (step-time model), ``text`` + ``tools`` (deterministic output and tool
calls), ``publisher`` (ZMQ KV events + replay), ``engine`` (the asyncio step loop), ``role``
(prefill/decode seam), ``service`` + ``openai_api`` + ``sglang_api`` + ``api`` (HTTP), ``metrics``.
"""

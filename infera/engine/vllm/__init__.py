"""The vLLM worker wrapper: ``python -m infera.engine.vllm`` (see :mod:`infera.engine.wrapper`)."""

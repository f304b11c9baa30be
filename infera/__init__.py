"""infera: an OpenAI- and Anthropic-compatible frontend and KV-aware router for LLM engine fleets."""

__version__ = "0.1.0"

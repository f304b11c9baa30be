"""The SGLang worker wrapper: ``python -m infera.engine.sglang`` (see :mod:`infera.engine.wrapper`)."""

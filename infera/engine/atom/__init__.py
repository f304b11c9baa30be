"""The ATOM worker wrapper: ``python -m infera.engine.atom`` (see :mod:`infera.engine.wrapper`)."""

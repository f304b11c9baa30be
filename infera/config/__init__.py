"""Settings schemas, one per process kind, resolved flag > env > default in :mod:`infera.config.base`."""

from infera.config.base import ConfigError, load

__all__ = ["ConfigError", "load"]

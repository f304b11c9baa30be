"""Settings of the operator (``python -m infera.operator``), and how it renders settings into pods.

The operator never hand-types a frontend or worker flag: it builds the process's settings object
(so ``__post_init__`` validates the combination, exactly as the process will at start) and renders
the fields that differ from their defaults as env vars named by the schema (:func:`render_env`).
Values may be Kubernetes dependent-variable references such as ``$(POD_NAME)``, which the kubelet
expands before the process reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from infera.config.base import ConfigError, env_names, option


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    namespace: str = option("", "namespace whose InferaFleets are reconciled; empty = all namespaces",
                            env=("INFERA_OPERATOR_NAMESPACE",))
    resync_seconds: float = option(30.0, "seconds between periodic reconciles of every fleet (status follows "
                                         "what runs even when nothing changes the InferaFleet)")
    liveness_port: int = option(8080, "port of the operator's /healthz (0 = none)")
    log_level: str = option("info", "logging level", choices=("debug", "info", "warning", "error"))

    def __post_init__(self) -> None:
        if self.resync_seconds <= 0:
            raise ConfigError("--resync-seconds must be > 0")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        for item in value:
            if any(c in str(item) for c in ", \t\n"):
                raise ConfigError(f"cannot render {item!r} in an env list (commas and spaces split it)")
        return ",".join(str(item) for item in value)
    return str(value)


def render_env(cls: type[Any], values: Mapping[str, Any]) -> list[dict[str, str]]:
    """``values`` (field name -> value) as env vars of ``cls``'s schema, validated by building ``cls``.

    Only fields whose value differs from the default are rendered, in schema order. Unknown field
    names and invalid combinations raise :class:`ConfigError`.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{cls.__name__} has no setting {', '.join(unknown)}")
    try:
        cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from exc
    env = []
    for name, f in fields.items():
        if name in values and values[name] != f.default:
            env.append({"name": env_names(f)[0], "value": _text(values[name])})
    return env

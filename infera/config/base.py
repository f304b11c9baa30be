"""One way to turn flags, environment variables and defaults into settings.

Every process kind declares its settings as a frozen dataclass whose fields carry
an :func:`option` description. :func:`load` builds the argparse parser from that
schema (so ``--help`` shows each default and its env name) and resolves every
value flag > env > default, in this one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "INFERA_"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Option:
    help: str
    env: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    repeat: bool = False
    parse: Callable[[str], Any] | None = None


def option(
    default: Any,
    help: str,
    *,
    env: str | Sequence[str] | None = None,
    choices: Sequence[str] | None = None,
    parse: Callable[[str], Any] | None = None,
    secret: bool = False,
) -> Any:
    """Declare a settings field. ``env`` defaults to ``INFERA_<FIELD_NAME>``; a ``secret`` is left out of
    the settings' repr, so logging the settings never logs it."""
    envs: tuple[str, ...] = (env,) if isinstance(env, str) else tuple(env or ())
    repeat = isinstance(default, tuple)
    meta = Option(help=help, env=envs, choices=tuple(choices) if choices else None, repeat=repeat, parse=parse)
    return dataclasses.field(default=default, metadata={"infera": meta}, repr=not secret)


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message says which and why."""


def _meta(f: dataclasses.Field[Any]) -> Option:
    meta = f.metadata.get("infera")
    if not isinstance(meta, Option):
        raise TypeError(f"field {f.name} has no option() metadata")
    return meta


def env_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    meta = _meta(f)
    return meta.env or (ENV_PREFIX + f.name.upper(),)


def flag_name(f: dataclasses.Field[Any]) -> str:
    return "--" + f.name.replace("_", "-")


def _converter(f: dataclasses.Field[Any]) -> Callable[[str], Any]:
    meta = _meta(f)
    if meta.parse is not None:
        return meta.parse
    default = f.default
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    return str


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def build_parser(cls: type[Any], prog: str, description: str,
                 choices: Mapping[str, Sequence[str]] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for f in dataclasses.fields(cls):
        meta = _meta(f)
        envs = ", ".join(env_names(f))
        shown = "(none)" if f.default in (None, (), "") else f.default
        if isinstance(shown, tuple):
            shown = " ".join(map(str, shown))
        text = f"{meta.help} [default: {shown}; env: {envs}]"
        kwargs: dict[str, Any] = {"dest": f.name, "help": text, "default": argparse.SUPPRESS}
        allowed = _choices(f, meta, choices)
        if allowed:
            kwargs["choices"] = allowed
        if isinstance(f.default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = str
            kwargs["metavar"] = f.name.upper()
            if meta.repeat:
                kwargs["action"] = "append"
        parser.add_argument(flag_name(f), **kwargs)
    # ArgumentDefaultsHelpFormatter would print SUPPRESS; the help text already carries defaults.
    parser.formatter_class = argparse.HelpFormatter
    return parser


def _choices(f: dataclasses.Field[Any], meta: Option,
             override: Mapping[str, Sequence[str]] | None) -> tuple[str, ...] | None:
    if override is not None and f.name in override:
        return tuple(override[f.name])
    return meta.choices


def load(cls: type[T], argv: Sequence[str] | None, environ: Mapping[str, str] | None = None, *,
         prog: str = "infera", description: str = "", choices: Mapping[str, Sequence[str]] | None = None) -> T:
    """Resolve ``cls`` from argv > environ > field defaults. Exits with usage on bad flags.

    ``choices`` replaces a field's declared choices (by field name): a process passes its
    registries' names, so a plugin registered by name is selectable without a second list.
    """
    environ = os.environ if environ is None else environ
    parser = build_parser(cls, prog, description, choices)
    ns = vars(parser.parse_args(list(argv) if argv is not None else None))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = _meta(f)
        conv = _converter(f)
        raw: Any
        source: str
        if f.name in ns:
            raw, source = ns[f.name], flag_name(f)
        else:
            env = next((e for e in env_names(f) if environ.get(e, "") != ""), None)
            if env is None:
                continue
            raw, source = environ[env], env
            if meta.repeat:
                raw = [part for part in raw.replace(",", " ").split() if part]
        try:
            if meta.repeat:
                items = raw if isinstance(raw, list) else [raw]
                value: Any = tuple(conv(item) for item in items)
            elif isinstance(raw, bool):
                value = raw
            else:
                value = conv(raw)
        except (TypeError, ValueError) as exc:
            parser.error(f"{source}: {exc}")
        allowed = _choices(f, meta, choices)
        if allowed and not meta.repeat and value not in allowed:
            parser.error(f"{source}: {value!r} is not one of {', '.join(allowed)}")
        values[f.name] = value
    try:
        return cls(**values)
    except ConfigError as exc:
        parser.error(str(exc))

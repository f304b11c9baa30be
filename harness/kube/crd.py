"""What the API server does with a custom resource before storing it: prune, default, validate, CEL.

Given a CRD's structural schema (``openAPIV3Schema``), an incoming object is

1. **pruned**: fields the schema does not name are dropped (unless ``x-kubernetes-preserve-unknown-fields``);
2. **defaulted**: absent fields with a ``default`` get it, recursively (a defaulted object is then
   defaulted inside);
3. **validated**: OpenAPI v3 keywords through jsonschema (``nullable`` and
   ``x-kubernetes-int-or-string`` understood), each error reported with its field path;
4. **checked by CEL**: every ``x-kubernetes-validations`` rule is evaluated with cel-python, ``self``
   bound to the value at that node (and ``oldSelf`` to the stored one on an update, for transition
   rules, which are skipped on create as the API server does).

Errors come back as the API server words them: ``spec.pools.mixed.replicas: Invalid value: -1: ...``.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema  # type: ignore[import-untyped]
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

STRUCTURAL = ("type", "properties", "items", "additionalProperties", "default", "nullable",
              "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations")
META_FIELDS = ("apiVersion", "kind", "metadata")


def prune(schema: dict[str, Any], value: Any) -> Any:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, sub in value.items():
            if props is not None and key in props:
                out[key] = prune(props[key], sub)
            elif isinstance(extra, dict):
                out[key] = prune(extra, sub)
            elif extra is True:
                out[key] = sub
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], v) for v in value]
    return value


def default(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out and out[key] is not None:
                out[key] = default(sub, out[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in out:
                if key not in (schema.get("properties") or {}):
                    out[key] = default(extra, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [default(schema["items"], v) for v in value]
    return value


def _json_schema(schema: Any) -> Any:
    """OpenAPI v3 (Kubernetes' dialect) -> JSON Schema draft 7 for jsonschema."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k not in ("nullable", "default", "description", "example")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    return out


def _path(parts: Any) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _cel(schema: dict[str, Any], value: Any, old: Any, where: str, errors: list[str]) -> None:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule["rule"]
        transition = "oldSelf" in text
        if transition and old is None:
            continue  # transition rules apply to updates only
        env = celpy.Environment()
        program = env.program(env.compile(text))
        bindings = {"self": json_to_cel(value)}
        if transition:
            bindings["oldSelf"] = json_to_cel(old)
        try:
            ok = program.evaluate(bindings)
        except CELEvalError as exc:
            errors.append(f"{where or '<root>'}: Invalid value: CEL rule {text!r} could not be evaluated: {exc}")
            continue
        if not bool(ok):
            message = rule.get("message") or f"failed rule: {text}"
            errors.append(f"{where or '<root>'}: Invalid value: \"object\": {message}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in value.items():
            if key in props:
                child_old = old.get(key) if isinstance(old, dict) else None
                _cel(props[key], sub, child_old, f"{where}.{key}" if where else key, errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _cel(schema["items"], item, None, f"{where}[{i}]", errors)


def admit(schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The object the server would store (pruned and defaulted) and the reasons it would refuse it."""
    body = {k: v for k, v in obj.items() if k not in META_FIELDS}
    body = default(schema, prune(schema, body))
    stored = {**{k: obj[k] for k in META_FIELDS if k in obj}, **body}
    errors = [f"{_path(e.absolute_path)}: Invalid value: {e.instance!r}: {e.message}"
              for e in sorted(jsonschema.Draft7Validator(_json_schema(schema)).iter_errors(body),
                              key=lambda e: list(map(str, e.absolute_path)))]
    if not errors:
        old_body = {k: v for k, v in old.items() if k != "apiVersion"} if old is not None else None
        _cel(schema, {**body, "metadata": obj.get("metadata") or {}}, old_body, "", errors)  # root rules see it
    return stored, errors


def established(definition: dict[str, Any], now: str) -> dict[str, Any]:
    """The status the API server gives a CRD it serves: names accepted, Established (what ``kubectl wait
    --for=condition=Established`` and Helm's readiness check read)."""
    conditions = [{"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}
                  for kind, reason, message in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                                ("Established", "InitialNamesAccepted", "the initial names have been "
                                                 "accepted"))]
    spec = definition.get("spec") or {}
    return {"acceptedNames": spec.get("names") or {}, "conditions": conditions,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")]}

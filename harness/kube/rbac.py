"""RBAC as the API server evaluates it, from the Roles and bindings stored in the emulator.

A request's user comes from its bearer token: ``emulator`` (or no token: kubectl sends none over
plain HTTP) is the cluster admin, ``sa:<namespace>:<name>`` is that service account (``system:serviceaccount:...``;
what a pod runs as). A service account may do what the rules of the (Cluster)Roles bound to it
allow: a ClusterRoleBinding anywhere, a RoleBinding in its namespace (``apiGroups``, ``resources``
with ``*`` and ``resource/subresource``, ``verbs``, ``resourceNames``). Discovery and ``/version``
are open to every authenticated user. Creating or updating a (Cluster)Role with rules the requester
does not hold, or binding a role whose rules it does not hold, is refused (the escalation check)
unless it holds the ``escalate`` or ``bind`` verb on roles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

ADMIN_TOKEN = "emulator"
Rule = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    namespace: str = ""  # a service account's namespace
    admin: bool = False


def user_of(token: str) -> User | None:
    if token == ADMIN_TOKEN:
        return User("kubernetes-admin", admin=True)
    if token.startswith("sa:") and token.count(":") == 2:
        _, ns, name = token.split(":")
        return User(f"system:serviceaccount:{ns}:{name}", namespace=ns)
    return None


def sa_token(namespace: str, name: str) -> str:
    return f"sa:{namespace}:{name}"


@dataclasses.dataclass(frozen=True)
class Request:
    verb: str  # get list watch create update patch delete
    group: str
    resource: str  # plural, or plural/subresource
    namespace: str
    name: str = ""


def _covers(rule: Rule, req: Request) -> bool:
    def has(values: Iterable[str], want: str) -> bool:
        return "*" in values or want in values

    if not has(rule.get("verbs") or [], req.verb) or not has(rule.get("apiGroups") or [], req.group):
        return False
    resources = rule.get("resources") or []
    base = req.resource.split("/")[0]
    if not (has(resources, req.resource) or (req.resource == base and has(resources, base))
            or f"{base}/*" in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or req.name in names


class Authorizer:
    """Answers from the store as it is now: ``objects(kind)`` lists stored RBAC objects of a kind."""

    def __init__(self, objects: Callable[[str], list[dict[str, Any]]]) -> None:
        self._objects = objects

    def rules(self, user: User, namespace: str) -> list[Rule]:
        if user.admin:
            return [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
        found: list[Rule] = []
        for kind, scoped in (("ClusterRoleBinding", False), ("RoleBinding", True)):
            for binding in self._objects(kind):
                if scoped and binding["metadata"].get("namespace") != namespace:
                    continue
                if not any(self._subject(s, binding, user) for s in binding.get("subjects") or []):
                    continue
                found += self._role_rules(binding["roleRef"], binding["metadata"].get("namespace", ""))
        return found

    @staticmethod
    def _subject(subject: dict[str, Any], binding: dict[str, Any], user: User) -> bool:
        if subject.get("kind") == "ServiceAccount":
            ns = subject.get("namespace") or binding["metadata"].get("namespace", "")
            return f"system:serviceaccount:{ns}:{subject.get('name')}" == user.name
        return bool(subject.get("kind") == "User" and subject.get("name") == user.name)

    def _role_rules(self, ref: dict[str, Any], namespace: str) -> list[Rule]:
        for role in self._objects(ref.get("kind", "")):
            meta = role["metadata"]
            scoped = ref.get("kind") == "ClusterRole" or meta.get("namespace") == namespace
            if meta["name"] == ref.get("name") and scoped:
                return list(role.get("rules") or [])
        return []

    def allowed(self, user: User, req: Request) -> bool:
        return any(_covers(rule, req) for rule in self.rules(user, req.namespace))

    def escalation(self, user: User, obj: dict[str, Any], verb: str) -> str | None:
        """Why writing this Role/ClusterRole/binding would give ``user`` more than it holds (None: fine)."""
        if user.admin or obj.get("kind") not in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
            return None
        ns = obj["metadata"].get("namespace", "")
        roles = "clusterroles" if obj["kind"].startswith("Cluster") else "roles"
        if obj["kind"].endswith("Binding"):
            if self.allowed(user, Request("bind", "rbac.authorization.k8s.io", roles, ns)):
                return None
            wanted = self._role_rules(obj.get("roleRef") or {}, ns)
        else:
            if self.allowed(user, Request("escalate", "rbac.authorization.k8s.io", roles, ns)):
                return None
            wanted = list(obj.get("rules") or [])
        held = self.rules(user, ns)
        for rule in wanted:
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        probe = Request(v, group, resource, ns)
                        if not any(_covers(h, probe) for h in held):
                            return (f"user {user.name!r} cannot {verb} a {obj['kind']} granting {v} on "
                                    f"{resource}.{group or 'core'}: attempting to grant RBAC permissions not "
                                    "currently held")
        return None

"""Bearer-token authentication and (optional) namespaced RBAC for service accounts.

Owns: the admin token, the tokens minted for service-account secrets (by the token controller)
and by the TokenRequest subresource, and the decision "who is this request". Tokens look like
JWTs (header.claims.signature, base64url) so tools that peek at claims work, but the signature
is random: the simulator only checks tokens it issued itself.

A secret token stays valid while its Secret (same uid) and ServiceAccount exist; a
TokenRequest token while it has not expired and its ServiceAccount (same uid) exists — so
deleting a namespace revokes its tokens, as on a real cluster.

The admin's own credential can change while the server runs, as a real cluster's does:
`rotate_admin_token` replaces the static admin token (the old one is refused from then on,
like a rotated kubeconfig token), `issue_admin_token` hands out further admin tokens that
expire on the token clock (what an exec plugin such as `aws eks get-token` prints), and
`revoke` refuses one of those before its time. Every refused request is counted
(`rejected`), so tests can tell how often a client came with stale credentials.

Authorization: the admin may do everything. Service accounts are not restricted unless RBAC
enforcement is switched on (`SimulatorConfig.enforce_rbac`); then a request is allowed when a
rule grants it: ClusterRoles bound by ClusterRoleBindings (everywhere, cluster scope
included), and Roles or ClusterRoles bound by RoleBindings in the request's namespace.
Escalation prevention is modelled as on a real server: creating or updating a Role or
ClusterRole needs every permission it grants (in that namespace; cluster-wide for a
ClusterRole) or `escalate` on roles/clusterroles; creating or updating a binding needs every
permission of the referenced role or `bind` on it (see `escalation_problem`,
`binding_problem`). Not modelled: aggregated ClusterRoles, nonResourceURLs,
impersonation.
"""

from __future__ import annotations

import base64
import collections
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from nodepool_k8s.dev.simulator.store import Store

ISSUER = "https://kubernetes.default.svc.cluster.local"
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Identity:
    username: str
    groups: tuple[str, ...]
    uid: str = ""
    admin: bool = False
    sa_namespace: str | None = None
    sa_name: str | None = None

    def as_user_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            info["uid"] = self.uid
        return info


@dataclass(frozen=True)
class _Grant:
    namespace: str
    sa_name: str
    sa_uid: str
    secret_name: str | None = None
    secret_uid: str | None = None
    expires: float | None = None  # epoch seconds; None = no expiry (legacy secret tokens)
    audiences: tuple[str, ...] = ()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt_like(claims: dict[str, Any]) -> str:
    header = {"alg": "RS256", "kid": "nodepool-k8s-sim"}
    return ".".join((_b64url(json.dumps(header).encode()),
                     _b64url(json.dumps(claims, sort_keys=True).encode()),
                     _b64url(secrets.token_bytes(48))))


class TokenAuthority:
    def __init__(self, store: Store, admin_token: str | None = None) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._grants: dict[str, _Grant] = {}
        self.admin_token = admin_token or "sim-admin-" + secrets.token_urlsafe(24)
        self.admin = Identity("sim-admin", ("system:masters", "system:authenticated"),
                              admin=True)
        # Further admin tokens (issue_admin_token) -> expiry (epoch seconds; None: never).
        self._admin_tokens: dict[str, float | None] = {}
        self.rejected = 0  # requests refused for want of a valid credential (401)
        # The latest refused requests as (method, path), so a test can tell a request that
        # was already on its way when credentials changed from one sent afterwards.
        self.rejected_log: collections.deque[tuple[str, str]] = collections.deque(maxlen=256)
        # The token clock (epoch seconds): tests move it on to see tokens expire (401).
        self.now: Callable[[], float] = time.time

    # -- the admin's credentials ------------------------------------------------------------
    def rotate_admin_token(self, token: str | None = None) -> str:
        """Replace the static admin token (`token`, or a fresh random one) and return it;
        the previous one is refused (401) from now on."""
        with self._lock:
            self.admin_token = token or "sim-admin-" + secrets.token_urlsafe(24)
            return self.admin_token

    def issue_admin_token(self, lifetime: float | None = None) -> str:
        """A further token that authenticates as the admin until `lifetime` seconds from
        now on the token clock (None: until revoked)."""
        token = "sim-admin-exec-" + secrets.token_urlsafe(24)
        with self._lock:
            self._admin_tokens[token] = None if lifetime is None else self.now() + lifetime
        return token

    def revoke(self, token: str) -> None:
        """Refuse a token from `issue_admin_token` from now on (unknown tokens: no-op)."""
        with self._lock:
            self._admin_tokens.pop(token, None)

    def count_rejected(self, method: str, path: str) -> None:
        with self._lock:
            self.rejected += 1
            self.rejected_log.append((method, path))

    def rejected_since_start(self) -> list[tuple[str, str]]:
        """The latest refused requests (at most 256), oldest first."""
        with self._lock:
            return list(self.rejected_log)

    def _is_admin(self, token: str) -> bool:
        with self._lock:
            if hmac.compare_digest(token.encode(), self.admin_token.encode()):
                return True
            if token not in self._admin_tokens:
                return False
            expires = self._admin_tokens[token]
        return expires is None or self.now() < expires

    # -- issuing ----------------------------------------------------------------------------
    def issue_secret_token(self, namespace: str, sa_name: str, sa_uid: str,
                           secret_name: str, secret_uid: str) -> str:
        token = _jwt_like({
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": namespace,
            "kubernetes.io/serviceaccount/secret.name": secret_name,
            "kubernetes.io/serviceaccount/service-account.name": sa_name,
            "kubernetes.io/serviceaccount/service-account.uid": sa_uid,
            "sub": f"system:serviceaccount:{namespace}:{sa_name}",
        })
        with self._lock:
            self._grants[token] = _Grant(namespace, sa_name, sa_uid, secret_name, secret_uid)
        return token

    def issue_request_token(self, namespace: str, sa_name: str, sa_uid: str,
                            audiences: list[str], expiration_seconds: int) -> tuple[str, float]:
        now = self.now()
        expires = now + expiration_seconds
        token = _jwt_like({
            "aud": audiences, "exp": int(expires), "iat": int(now), "nbf": int(now),
            "iss": ISSUER,
            "kubernetes.io": {"namespace": namespace,
                              "serviceaccount": {"name": sa_name, "uid": sa_uid}},
            "sub": f"system:serviceaccount:{namespace}:{sa_name}",
        })
        with self._lock:
            self._grants[token] = _Grant(namespace, sa_name, sa_uid, expires=expires,
                                         audiences=tuple(audiences))
        return token, expires

    # -- checking ---------------------------------------------------------------------------
    def authenticate_token(self, token: str) -> Identity | None:
        if self._is_admin(token):
            return self.admin
        with self._lock:
            grant = self._grants.get(token)
        if grant is None:
            return None
        if grant.expires is not None and self.now() >= grant.expires:
            return None
        sa = self._store.get("serviceaccounts", grant.namespace, grant.sa_name)
        if sa is None or sa["metadata"]["uid"] != grant.sa_uid:
            return None
        if grant.secret_name is not None:
            secret = self._store.get("secrets", grant.namespace, grant.secret_name)
            if secret is None or secret["metadata"]["uid"] != grant.secret_uid:
                return None
        return Identity(f"system:serviceaccount:{grant.namespace}:{grant.sa_name}",
                        ("system:serviceaccounts", f"system:serviceaccounts:{grant.namespace}",
                         "system:authenticated"),
                        uid=grant.sa_uid, sa_namespace=grant.namespace, sa_name=grant.sa_name)

    def authenticate(self, authorization_header: str | None) -> Identity | None:
        if not authorization_header:
            return None
        scheme, _, token = authorization_header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.authenticate_token(token.strip())

    def authorize(self, identity: Identity, verb: str, group: str, resource: str,
                  namespace: str | None, name: str | None) -> bool:
        """Does a rule bound to `identity` grant `verb` on `resource` (in `namespace`)?"""
        if identity.admin:
            return True
        return any(self._rule_allows(rule, verb, group, resource, name)
                   for rule in self._rules(identity, namespace))

    def _rules(self, identity: Identity, namespace: str | None) -> list[dict[str, Any]]:
        """Every rule granted to `identity` in `namespace` (None: cluster-wide only)."""
        rules: list[dict[str, Any]] = []
        scopes: list[tuple[str, str | None]] = [("clusterrolebindings", None)]
        if namespace:
            scopes.append(("rolebindings", namespace))
        for plural, scope in scopes:
            bindings, _ = self._store.list(plural, scope)
            for binding in bindings:
                if not any(self._subject_matches(s, identity, scope or "")
                           for s in binding.get("subjects") or []):
                    continue
                ref = binding.get("roleRef") or {}
                if ref.get("kind") == "ClusterRole":
                    role = self._store.get("clusterroles", None, ref.get("name", ""))
                elif ref.get("kind") == "Role" and scope:
                    role = self._store.get("roles", scope, ref.get("name", ""))
                else:
                    role = None
                if role is not None:
                    rules += [r for r in role.get("rules") or [] if isinstance(r, dict)]
        return rules

    def _uncovered(self, identity: Identity, namespace: str | None,
                   rules: list[Any]) -> list[str]:
        """The permissions of `rules` that `identity` does not hold in `namespace`."""
        missing: list[str] = []
        for rule in rules:
            if not isinstance(rule, dict):
                continue
            names = rule.get("resourceNames") or [None]
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        for name in names:
                            if not self.authorize(identity, verb, group, resource, namespace,
                                                  name):
                                what = f"{verb} {resource}" + (f".{group}" if group else "")
                                missing.append(what + (f" {name}" if name else ""))
        return missing

    def escalation_problem(self, identity: Identity, plural: str, namespace: str | None,
                           role: dict[str, Any]) -> str | None:
        """Why `identity` may not write `role` (None: it may)."""
        name = str((role.get("metadata") or {}).get("name") or "")
        if self.authorize(identity, "escalate", RBAC_GROUP, plural, namespace, name):
            return None
        missing = self._uncovered(identity, namespace, list(role.get("rules") or []))
        return "; ".join(missing) if missing else None

    def binding_problem(self, identity: Identity, namespace: str | None,
                        binding: dict[str, Any]) -> str | None:
        """Why `identity` may not write `binding` (None: it may)."""
        ref = binding.get("roleRef") or {}
        kind, name = ref.get("kind"), str(ref.get("name") or "")
        plural = "clusterroles" if kind == "ClusterRole" else "roles"
        if self.authorize(identity, "bind", RBAC_GROUP, plural, namespace, name):
            return None
        role = (self._store.get("clusterroles", None, name) if kind == "ClusterRole"
                else self._store.get("roles", namespace, name) if namespace else None)
        if role is None:
            return f"{kind} {name!r} not found and no bind permission on it"
        missing = self._uncovered(identity, namespace, list(role.get("rules") or []))
        return "; ".join(missing) if missing else None

    @staticmethod
    def _subject_matches(subject: dict[str, Any], identity: Identity, namespace: str) -> bool:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "ServiceAccount":
            return (name == identity.sa_name
                    and (subject.get("namespace") or namespace) == identity.sa_namespace)
        if kind == "User":
            return name == identity.username
        if kind == "Group":
            return name in identity.groups
        return False

    @staticmethod
    def _rule_allows(rule: dict[str, Any], verb: str, group: str, resource: str,
                     name: str | None) -> bool:
        def has(values: Any, wanted: str) -> bool:
            return isinstance(values, list) and ("*" in values or wanted in values)
        if not has(rule.get("verbs"), verb) or not has(rule.get("apiGroups"), group):
            return False
        if not has(rule.get("resources"), resource):
            base, _, sub = resource.partition("/")
            if not (sub and has(rule.get("resources"), f"{base}/*")):
                return False
        names = rule.get("resourceNames")
        return not names or (name is not None and name in names)

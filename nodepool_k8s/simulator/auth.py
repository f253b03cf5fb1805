"""Bearer-token authentication and (optional) namespaced RBAC for service accounts.

Owns: the admin token, the tokens minted for service-account secrets (by the token controller)
and by the TokenRequest subresource, and the decision "who is this request". Tokens look like
JWTs (header.claims.signature, base64url) so tools that peek at claims work, but the signature
is random: the simulator only checks tokens it issued itself.

A secret token stays valid while its Secret (same uid) and ServiceAccount exist; a
TokenRequest token while it has not expired and its ServiceAccount (same uid) exists — so
deleting a namespace revokes its tokens, as on a real cluster.

Authorization: the admin may do everything. Service accounts are not restricted unless RBAC
enforcement is switched on (`SimulatorConfig.enforce_rbac`); then only namespaced Roles bound
by RoleBindings in the request's namespace grant access (ClusterRoles and cluster-scoped
access are not modelled, so service accounts cannot touch cluster-scoped resources).
"""

from __future__ import annotations

import base64
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from nodepool_k8s.simulator.store import Store

ISSUER = "https://kubernetes.default.svc.cluster.local"


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
        # The token clock (epoch seconds): tests move it on to see tokens expire (401).
        self.now: Callable[[], float] = time.time

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
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
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
        """Does a Role bound in `namespace` grant `verb` on `resource` to `identity`?"""
        if identity.admin:
            return True
        if not namespace:
            return False
        bindings, _ = self._store.list("rolebindings", namespace)
        for binding in bindings:
            if not any(self._subject_matches(s, identity, namespace)
                       for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            if ref.get("kind") != "Role":
                continue
            role = self._store.get("roles", namespace, ref.get("name", ""))
            if role is None:
                continue
            for rule in role.get("rules") or []:
                if self._rule_allows(rule, verb, group, resource, name):
                    return True
        return False

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

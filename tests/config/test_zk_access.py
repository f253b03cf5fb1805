"""`zookeeper-auth` and `zookeeper-acl`: defaults, the secure file, and every problem named."""

from __future__ import annotations

import pytest

from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import ZkAcl, ZkAuth, ZkGrant
from nodepool_k8s.core.errors import ConfigError

MAIN = "zookeeper-servers:\n  - host: zk\n"
AUTH = "zookeeper-auth:\n  username: nodepool\n  password: s3cret\n"


def load(main: str, secure: str | None = None):  # type: ignore[no-untyped-def]
    return load_config_text(MAIN + main, path="main.yaml", secure_text=secure,
                            secure_path="secure.yaml", env={})


def problems(main: str, secure: str | None = None) -> tuple[str | None, list[str]]:
    with pytest.raises(ConfigError) as caught:
        load(main, secure)
    return caught.value.path, caught.value.problems


def test_defaults_are_open() -> None:
    config = load("")
    assert config.zookeeper_auth is None and config.zookeeper_acl is None


def test_secure_file_carries_credentials_and_acl() -> None:
    secure = MAIN + AUTH + (
        "zookeeper-acl:\n  grants:\n"
        "    - {scheme: digest, username: zuul, password: z}\n"
        "    - {scheme: x509, id: 'CN=zuul,O=Example', permissions: [read, write]}\n")
    config = load("", secure)
    assert config.zookeeper_auth == ZkAuth("digest", "nodepool", "s3cret")
    assert config.zookeeper_acl == ZkAcl(enabled=True, grants=(
        ZkGrant("digest", username="zuul", password="z"),
        ZkGrant("x509", id="CN=zuul,O=Example", permissions=("read", "write"))))
    assert "s3cret" not in repr(config.zookeeper_auth)
    # Digest credentials without zookeeper-tls are sent in clear text.
    assert config.warnings == (DIGEST_IN_CLEAR,)


def test_password_in_main_file_is_a_warning() -> None:
    config = load(AUTH)
    assert config.warnings == (
        "main.yaml: zookeeper-auth: warning: holds a password: keep it in the secure file"
        " (-s), which only the launcher can read", DIGEST_IN_CLEAR)


# -- warnings about what travels or lies open ------------------------------------------------

DIGEST_IN_CLEAR = ("main.yaml: zookeeper-auth: warning: digest credentials without"
                   " zookeeper-tls travel in clear text to ZooKeeper, for anyone on the network"
                   " path to read; set zookeeper-tls (doc/security.md, ZooKeeper access"
                   " control)")
K8S_PROVIDER = ("labels: [{name: ns}]\nproviders:\n  - name: k8s\n    driver: kubernetes\n"
                "    pools: [{name: main, labels: [{name: ns, type: namespace}]}]\n")
FAKE_PROVIDER = ("labels: [{name: ns}]\nproviders:\n  - name: fake\n    driver: fake\n"
                 "    pools: [{name: main, labels: [{name: ns}]}]\n")


def _tls(tmp_path) -> str:  # type: ignore[no-untyped-def]
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    return (f"zookeeper-tls: {{cert: {tmp_path}/c.pem, key: {tmp_path}/k.pem,"
            f" ca: {tmp_path}/ca.pem}}\n")


def test_open_acl_with_a_kubernetes_provider_is_a_warning() -> None:
    (warning,) = load(K8S_PROVIDER).warnings
    assert warning.startswith("main.yaml: zookeeper-acl: warning: off: node records of"
                              " kubernetes providers hold their namespace's service-account"
                              " token"), warning
    assert "set zookeeper-acl" in warning
    (warning,) = load(K8S_PROVIDER + "zookeeper-acl: {enabled: false}\n").warnings
    assert warning.startswith("main.yaml: zookeeper-acl: warning: off: ")
    # Fake providers hand out no credentials.
    assert load(FAKE_PROVIDER).warnings == ()


def test_acl_with_tls_warns_about_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = load(K8S_PROVIDER, _tls(tmp_path) + "zookeeper-acl: {}\n")
    assert config.warnings == ()
    config = load(K8S_PROVIDER, _tls(tmp_path) + AUTH + "zookeeper-acl: {}\n")
    assert config.warnings == ()


def test_digest_without_tls_is_a_warning_also_with_the_acl() -> None:
    config = load(K8S_PROVIDER, AUTH + "zookeeper-acl: {}\n")
    assert config.warnings == (DIGEST_IN_CLEAR,)


def test_acl_may_be_disabled_and_is_then_off() -> None:
    config = load("zookeeper-acl:\n  enabled: false\n")
    assert config.zookeeper_acl == ZkAcl(enabled=False)


def test_acl_needs_an_identity() -> None:
    path, found = problems("zookeeper-acl: {}\n")
    assert path == "main.yaml"
    assert found == ["zookeeper-acl: an ACL needs an identity for the launcher: set"
                     " zookeeper-auth (digest credentials) or zookeeper-tls (client"
                     " certificate, with ZooKeeper's x509 authentication provider)"]
    # The identity may come from the secure file.
    assert load("zookeeper-acl: {}\n", MAIN + AUTH).zookeeper_acl == ZkAcl()


@pytest.mark.parametrize("grant,problem", [
    ("{scheme: digest}", "zookeeper-acl.grants[0]: a digest grant needs either `id`"),
    ("{scheme: digest, id: 'a:b', username: u, password: p}",
     "zookeeper-acl.grants[0]: a digest grant needs either `id`"),
    ("{scheme: digest, username: u}",
     "zookeeper-acl.grants[0]: a digest grant needs both `username` and `password`"),
    ("{scheme: digest, id: nocolon}", "zookeeper-acl.grants[0].id: 'nocolon' is not a"
     " digest id"),
    ("{scheme: x509}", "zookeeper-acl.grants[0].id: required for a x509 grant"),
    ("{scheme: x509, username: u, password: p}",
     "zookeeper-acl.grants[0]: `username`/`password` are for digest grants only"),
    ("{scheme: world, id: anyone}", "zookeeper-acl.grants[0].scheme: expected one of"
     " digest, x509, sasl, ip; got 'world'"),
    ("{scheme: ip, id: 10.0.0.1, permissions: [everything]}",
     "zookeeper-acl.grants[0].permissions[0]: expected one of read, write, create,"
     " delete, admin, all"),
])
def test_grant_problems(grant: str, problem: str) -> None:
    _, found = problems(AUTH + f"zookeeper-acl:\n  grants:\n    - {grant}\n")
    assert any(p.startswith(problem) for p in found), found


def test_auth_problems_name_the_secure_file() -> None:
    path, found = problems("", MAIN + "zookeeper-auth:\n  scheme: sasl\n  username: u\n")
    assert path == "secure.yaml"
    assert "zookeeper-auth.scheme: expected one of digest; got 'sasl'" in found
    assert "zookeeper-auth.password: required key is missing" in found

"""`KubeClient.api`: the launch's and deletion's requests as prepared operations (`Endpoint`).

They must be the generated methods' requests in every way the launcher relies on: the same
answers and the same mapped errors, every request counted once by verb, resource and code
(the simulator's own count), a 401 that loads the credentials again, a new REST client
(credentials or CA reload) followed, a configured proxy used.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes.client import rest

from nodepool_k8s.core.errors import NodepoolError, TemporaryError
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.driver.kubernetes.client import KubeClient, RetryPolicy, load_configuration

ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "zuul"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}


def client_of(sim: Simulator, tmp_path: Path, token: str | None = None,
              seen: Counter[str] | None = None, **config: Any) -> KubeClient:
    """A client as the launcher connects it: credentials loaded again from the same file
    after a 401; `seen` counts the requests it reports (`verb resource code`)."""
    path = str(sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim", token=token))

    def load() -> Any:
        configuration, context = load_configuration("sim", path, 4)
        for key, value in config.items():
            setattr(configuration, key, value)
        return configuration, context

    configuration, context = load()

    def heard(provider: str, verb: str, resource: str, code: str) -> None:
        if seen is not None:
            seen[f"{verb} {resource} {code}"] += 1
    return KubeClient(configuration, context, RetryPolicy(retries=0), provider="sim",
                      load=load, backoff=(0.0,), on_api_call=heard)


def outcome(send: Callable[[], dict[str, Any]]) -> tuple[str, str, Any]:
    """What a call gave: the answer's kind, or the mapped error's type, message and
    Retry-After delay."""
    try:
        return "answer", str(send().get("kind")), None
    except NodepoolError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "delay", None)


def test_endpoints_answer_and_fail_as_the_generated_methods_do(
        make_sim: Callable[..., Simulator], tmp_path: Path) -> None:
    sim = make_sim()
    client = client_of(sim, tmp_path)
    core, rbac, api = client.core, client.rbac, client.api
    for name in ("gen", "end"):
        client.call("create namespace", core.create_namespace if name == "gen"
                    else api.create_namespace, {"metadata": {"name": name}})
        client.call("create sa", core.create_namespaced_service_account if name == "gen"
                    else api.create_namespaced_service_account, name,
                    {"metadata": {"name": "zuul-worker"}})
    token_request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                     "spec": {"expirationSeconds": 600}}

    def both(what: str, generated: Callable[..., Any], endpoint: Callable[..., Any],
             args: Callable[[str], tuple[Any, ...]], **kwargs: Any) -> None:
        """The same call through both ways (each in its own namespace): the same outcome."""
        before = outcome(lambda: client.call(what, generated, *args("gen"), **kwargs))
        after = outcome(lambda: client.call(what, endpoint, *args("end"), **kwargs))
        assert after == (before[0], before[1].replace("gen", "end"), before[2]), what

    both("create role", rbac.create_namespaced_role, api.create_namespaced_role,
         lambda ns: (ns, ROLE))
    both("create role", rbac.create_namespaced_role, api.create_namespaced_role,
         lambda ns: (ns, ROLE))  # 409: Conflict
    both("read namespace", core.read_namespace, api.read_namespace, lambda ns: (ns,))
    both("read namespace", core.read_namespace, api.read_namespace, lambda ns: ("none",))
    both("request token", core.create_namespaced_service_account_token,
         api.create_namespaced_service_account_token, lambda ns: ("zuul-worker", ns,
                                                                  token_request))
    both("request token", core.create_namespaced_service_account_token,
         api.create_namespaced_service_account_token, lambda ns: ("nobody", ns,
                                                                  token_request))
    for code in (429, 500, 403, 422):
        for _ in range(2):
            sim.fail_next("create", "pods", code=code)
        both(f"create pod ({code})", core.create_namespaced_pod, api.create_namespaced_pod,
             lambda ns: (ns, {"metadata": {"name": "p"},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    both("create pod (invalid)", core.create_namespaced_pod, api.create_namespaced_pod,
         lambda ns: (ns, {"metadata": {"name": "p"}}))
    both("delete namespace (stale uid)", core.delete_namespace, api.delete_namespace,
         lambda ns: (ns,), body={"preconditions": {"uid": "not-it"}})
    both("delete namespace", core.delete_namespace, api.delete_namespace, lambda ns: (ns,),
         body={"propagationPolicy": "Background"})
    for name in ("gen", "end"):  # gone, or going (the namespace controller's pace)
        left = sim.get("namespaces", name)
        assert left is None or left["metadata"].get("deletionTimestamp")
    client.close()


def test_every_endpoint_request_is_counted_once_by_verb_resource_and_code(
        make_sim: Callable[..., Simulator], tmp_path: Path) -> None:
    sim = make_sim()
    seen: Counter[str] = Counter()
    client = client_of(sim, tmp_path, seen=seen)
    api = client.api
    sim.reset_counters()
    client.call("create namespace", api.create_namespace, {"metadata": {"name": "n"}})
    client.call("create role", api.create_namespaced_role, "n", ROLE)
    with pytest.raises(NodepoolError):
        client.call("create role", api.create_namespaced_role, "n", ROLE)
    with pytest.raises(NodepoolError):
        client.call("read namespace", api.read_namespace, "missing")
    sim.fail_next("create", "limitranges", code=503)
    with pytest.raises(TemporaryError):
        client.call("create limit range", api.create_namespaced_limit_range, "n",
                    {"metadata": {"name": "l"}, "spec": {"limits": []}})
    client.call("delete namespace", api.delete_namespace, "n", body={})
    assert seen == Counter({"create namespaces 201": 1, "create roles 201": 1,
                            "create roles 409": 1, "get namespaces 404": 1,
                            "create limitranges 503": 1, "delete namespaces 200": 1})
    counted = Counter({k: v for k, v in sim.counters.items() if k != "total"})
    by_kind: Counter[str] = Counter()
    for key, value in seen.items():
        by_kind[key.rpartition(" ")[0]] += value
    assert counted == by_kind
    client.close()


def test_a_401_on_an_endpoint_loads_the_credentials_again(
        make_sim: Callable[..., Simulator], tmp_path: Path) -> None:
    sim = make_sim()
    old = sim.issue_admin_token()
    seen: Counter[str] = Counter()
    client = client_of(sim, tmp_path, token=old, seen=seen)
    client.call("create namespace", client.api.create_namespace, {"metadata": {"name": "a"}})
    sim.revoke_token(old)
    sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim",
                         token=sim.issue_admin_token())
    answer = client.call("read namespace", client.api.read_namespace, "a")
    assert answer["metadata"]["name"] == "a"
    assert seen["get namespaces 401"] == 1 and seen["get namespaces 200"] == 1
    assert client.credentials.condition()["reason"] == "Accepted"
    client.close()


def test_endpoints_follow_a_new_rest_client(make_sim: Callable[..., Simulator],
                                            tmp_path: Path) -> None:
    """As a credentials reload with a client certificate, or a rotated CA, swaps it: the
    old pool is closed, the next request goes through the new one."""
    sim = make_sim()
    client = client_of(sim, tmp_path)
    client.call("create namespace", client.api.create_namespace, {"metadata": {"name": "a"}})
    client.call("read namespace", client.api.read_namespace, "a")
    old = client.api_client.rest_client
    client.api_client.rest_client = rest.RESTClientObject(client.configuration)
    old.pool_manager.clear()
    assert client.call("read namespace", client.api.read_namespace, "a")["metadata"]["name"] \
        == "a"
    assert len(client.api_client.rest_client.pool_manager.pools) == 1
    client.close()


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP proxy that notes each request line it gets and answers 502."""
    listener = socket.create_server(("127.0.0.1", 0))
    lines: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                lines.append(head.split(b"\r\n")[0])
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", lines
    listener.close()
    thread.join(5)


@pytest.mark.parametrize("tls", [False, True])
def test_endpoints_go_through_a_configured_proxy(
        make_sim: Callable[..., Simulator], tmp_path: Path,
        proxy: tuple[str, list[bytes]], tls: bool) -> None:
    """The proxy gets the request (a plain HTTP one in the absolute form a proxy needs, an
    HTTPS one as a tunnel), the API server nothing."""
    sim = make_sim(tls=tls)
    url, lines = proxy
    client = client_of(sim, tmp_path, proxy=url)
    sim.reset_counters()
    with pytest.raises(TemporaryError):
        client.call("read namespace", client.api.read_namespace, "default")
    where = sim.url.split("://")[1]
    assert lines == [f"GET {sim.url}/api/v1/namespaces/default HTTP/1.1".encode()
                     if not tls else f"CONNECT {where} HTTP/1.0".encode()]
    assert sim.counters.get("total", 0) == 0
    client.close()

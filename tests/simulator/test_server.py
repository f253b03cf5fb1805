"""Transport and plumbing: TLS, plain HTTP, auth (and the admin's credentials changing at
runtime: rotated, expiring, revoked tokens; watches ended), keep-alive, bodies, discovery,
the CLI."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from tests.helpers import Signal, wait_for
from tests.simulator.conftest import Kube, connect


def https(sim: Simulator) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cadata=sim.ca_pem)
    return http.client.HTTPSConnection("127.0.0.1", sim.port, context=ctx, timeout=5)


def call(conn: http.client.HTTPConnection, method: str, path: str, token: str | None,
         body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        hdrs.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    raw = resp.read()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw


def test_kubeconfig_is_usable_and_private(k8s_sim: Simulator) -> None:
    path = Path(k8s_sim.kubeconfig_path or "")
    assert path.stat().st_mode & 0o777 == 0o600
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "sim"
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == k8s_sim.url and k8s_sim.url.startswith("https://127.0.0.1:")
    assert k8s_sim.ca_pem and k8s_sim.ca_pem.startswith("-----BEGIN CERTIFICATE-----")
    assert doc["users"][0]["user"]["token"] == k8s_sim.admin_token


def test_authentication(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    assert call(conn, "GET", "/version", None)[0] == 200  # public, as on a real cluster
    assert call(conn, "GET", "/healthz", None) == (200, b"ok")
    status, body = call(conn, "GET", "/api/v1/namespaces", None)
    assert status == 401 and body["reason"] == "Unauthorized"
    assert call(conn, "GET", "/api/v1/namespaces", "wrong")[0] == 401
    assert call(conn, "GET", "/api/v1/namespaces", k8s_sim.admin_token)[0] == 200


def test_admin_credentials_change_at_runtime(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    old = k8s_sim.admin_token
    new = k8s_sim.rotate_admin_token()
    assert new != old and k8s_sim.admin_token == new
    assert call(conn, "GET", "/api/v1/namespaces", old)[0] == 401
    assert call(conn, "GET", "/api/v1/namespaces", new)[0] == 200
    assert k8s_sim.rotate_admin_token("fixed-admin") == "fixed-admin"
    assert call(conn, "GET", "/api/v1/namespaces", "fixed-admin")[0] == 200

    # Expiring tokens, as an exec plugin prints them: valid until the token clock passes.
    start = k8s_sim.authority.now()
    short = k8s_sim.issue_admin_token(lifetime=60)
    forever = k8s_sim.issue_admin_token()
    assert call(conn, "GET", "/api/v1/namespaces", short)[0] == 200
    k8s_sim.authority.now = lambda: start + 61
    assert call(conn, "GET", "/api/v1/namespaces", short)[0] == 401
    assert call(conn, "GET", "/api/v1/namespaces", forever)[0] == 200
    k8s_sim.revoke_token(forever)
    assert call(conn, "GET", "/api/v1/namespaces", forever)[0] == 401
    assert k8s_sim.rejected_requests == 3


def test_the_anonymous_paths_refuse_a_refused_token(k8s_sim: Simulator) -> None:
    """As a real API server: no credentials is anonymous (/version and the health paths
    allowed); a bearer token that does not authenticate is 401 everywhere."""
    conn = https(k8s_sim)
    for path in ("/version", "/healthz", "/readyz"):
        assert call(conn, "GET", path, None)[0] == 200
        assert call(conn, "GET", path, k8s_sim.admin_token)[0] == 200
        assert call(conn, "GET", path, "not-a-token")[0] == 401
    assert k8s_sim.rejected_log == [("GET", "/version"), ("GET", "/healthz"),
                                    ("GET", "/readyz")]


def test_end_watches(k8s_sim: Simulator, kube: Kube, changes: Signal) -> None:
    response = kube.core.list_namespace(watch=True, _preload_content=False,
                                        timeout_seconds=60)
    changes.until(lambda: k8s_sim.open_watches == 1, message="the watch to open")
    k8s_sim.end_watches()
    response.read()  # the stream ends instead of running for 60 s
    response.release_conn()
    changes.until(lambda: k8s_sim.open_watches == 0, message="the watch to be gone")


def test_plain_http_and_keep_alive(make_sim: Any) -> None:
    sim, kube = make_sim(tls=False)
    assert sim.url.startswith("http://") and sim.ca_pem is None
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    call(conn, "GET", "/api/v1/namespaces", sim.admin_token)
    first_socket = conn.sock
    for _ in range(50):
        assert call(conn, "GET", "/api/v1/namespaces/default", sim.admin_token)[0] == 200
    assert conn.sock is first_socket  # one connection reused
    # Nagle + delayed ACK would cost ~40 ms per call: the server must switch it off.
    flags = sim.connections_nodelay()
    assert flags and all(flags)
    assert kube.core.list_namespace().items
    # kubectl sends no credentials over plain HTTP: no token is the admin there, a bad one not.
    assert call(conn, "GET", "/api/v1/namespaces", None)[0] == 200
    assert call(conn, "GET", "/api/v1/namespaces", "wrong")[0] == 401


def test_answers_carry_the_headers_of_a_kube_apiserver(k8s_sim: Simulator) -> None:
    """What a client parses per answer is what a real API server makes it parse: the same
    header names (an audit id per request, the priority-and-fairness uids), no others."""
    conn = https(k8s_sim)
    seen = []
    for path in ("/api/v1/namespaces/default", "/api/v1/namespaces/nothing-here"):
        conn.request("GET", path, headers={"Authorization": f"Bearer {k8s_sim.admin_token}"})
        resp = conn.getresponse()
        resp.read()
        assert sorted(name.lower() for name, _ in resp.getheaders()) == [
            "audit-id", "cache-control", "content-length", "content-type", "date",
            "x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"]
        assert resp.getheader("Cache-Control") == "no-cache, private"
        seen.append(resp.getheader("Audit-Id"))
    assert len(set(seen)) == 2  # one audit id per request
    conn.close()


def test_delete_bodies_are_read_on_keep_alive_connections(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    token = k8s_sim.admin_token
    assert call(conn, "POST", "/api/v1/namespaces", token, {"metadata": {"name": "d"}})[0] == 201
    for name in ("a", "b"):
        status, _ = call(conn, "POST", "/api/v1/namespaces/d/configmaps", token,
                         {"metadata": {"name": name}})
        assert status == 201
    status, body = call(conn, "DELETE", "/api/v1/namespaces/d/configmaps/a", token,
                        {"kind": "DeleteOptions", "apiVersion": "v1",
                         "propagationPolicy": "Background"})
    assert status == 200 and body["status"] == "Success"
    # The next request on the same connection parses cleanly.
    status, body = call(conn, "GET", "/api/v1/namespaces/d/configmaps", token)
    assert status == 200 and [i["metadata"]["name"] for i in body["items"]] == ["b"]
    # A GET with a body is tolerated too.
    status, _ = call(conn, "GET", "/api/v1/namespaces/d", token, {"ignored": True})
    assert status == 200
    assert call(conn, "GET", "/api/v1/namespaces/d", token)[0] == 200


def test_bad_requests(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    token = k8s_sim.admin_token
    conn.request("POST", "/api/v1/namespaces", body=b"{not json",
                 headers={"Authorization": f"Bearer {token}",
                          "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 400 and json.loads(resp.read())["reason"] == "BadRequest"
    status, body = call(conn, "GET", "/api/v1/deployments", token)
    assert status == 404 and body["reason"] == "NotFound"
    status, _ = call(conn, "PUT", "/api/v1/namespaces", token, {})
    assert status == 405
    status, _ = call(conn, "POST", "/api/v1/namespaces", token,
                     {"kind": "Pod", "metadata": {"name": "x"}})
    assert status == 400
    status, _ = call(conn, "PATCH", "/api/v1/namespaces/default", token, {"a": 1},
                     headers={"Content-Type": "application/apply-patch+yaml"})
    assert status == 415
    status, body = call(conn, "PATCH", "/api/v1/namespaces/default", token,
                        [{"op": "add", "path": "/metadata/labels/x", "value": "y"}],
                        headers={"Content-Type": "application/json-patch+json"})
    assert status == 200 and body["metadata"]["labels"]["x"] == "y"


def test_unknown_fields_are_kept(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "u"}})
    body = {"metadata": {"name": "c"}, "data": {"a": "b"}, "futureField": {"x": 1}}
    kube.core.create_namespaced_config_map("u", body)
    raw = kube.core.read_namespaced_config_map("c", "u", _preload_content=False)
    assert json.loads(raw.data)["futureField"] == {"x": 1}


def test_discovery(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    token = k8s_sim.admin_token
    version = call(conn, "GET", "/version", token)[1]
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.32.")
    assert call(conn, "GET", "/api", token)[1]["versions"] == ["v1"]
    groups = {g["name"] for g in call(conn, "GET", "/apis", token)[1]["groups"]}
    assert groups == {"rbac.authorization.k8s.io", "authentication.k8s.io",
                      "networking.k8s.io", "apps", "admissionregistration.k8s.io"}
    core = {r["name"]: r for r in call(conn, "GET", "/api/v1", token)[1]["resources"]}
    assert core["pods"]["shortNames"] == ["po"] and core["namespaces"]["namespaced"] is False
    assert core["serviceaccounts"]["shortNames"] == ["sa"]
    assert core["configmaps"]["shortNames"] == ["cm"] and "watch" in core["pods"]["verbs"]
    assert core["serviceaccounts/token"]["kind"] == "TokenRequest"
    rbac = call(conn, "GET", "/apis/rbac.authorization.k8s.io/v1", token)[1]
    assert {r["kind"] for r in rbac["resources"]} == {"Role", "RoleBinding", "ClusterRole",
                                                      "ClusterRoleBinding"}
    assert call(conn, "GET", "/apis/authentication.k8s.io/v1", token)[0] == 200
    assert call(conn, "GET", "/apis/batch/v1", token)[0] == 404
    index = call(conn, "GET", "/openapi/v3", token)[1]
    assert set(index["paths"]) >= {"api/v1", "apis/rbac.authorization.k8s.io/v1"}


def test_table_output(k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    status, table = call(conn, "GET", "/api/v1/namespaces", k8s_sim.admin_token,
                         headers={"Accept": accept})
    assert status == 200 and table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Status", "Age"]
    assert table["rows"][0]["cells"][:2] == ["default", "Active"]


def test_token_review(kube: Kube, k8s_sim: Simulator) -> None:
    conn = https(k8s_sim)
    status, body = call(conn, "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                        k8s_sim.admin_token, {"spec": {"token": k8s_sim.admin_token}})
    assert status == 201 and body["status"]["authenticated"] is True
    status, body = call(conn, "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                        k8s_sim.admin_token, {"spec": {"token": "bogus"}})
    assert body["status"]["authenticated"] is False


def test_context_manager_and_fixed_port_and_namespace(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Simulator(SimulatorConfig(port=port, admin_token="fixed-token")) as sim:
        assert sim.port == port and sim.admin_token == "fixed-token"
        path = sim.write_kubeconfig(tmp_path / "kc", context="other", namespace="kube-system")
        kube = connect(path, context="other")
        try:
            assert kube.core.list_namespaced_pod("kube-system").items == []
        finally:
            kube.close()
    with pytest.raises(RuntimeError):
        _ = Simulator().url  # not started


def test_server_survives_garbage(k8s_sim: Simulator, kube: Kube) -> None:
    raw = socket.create_connection(("127.0.0.1", k8s_sim.port))
    raw.sendall(b"this is not TLS\r\n\r\n")
    raw.close()
    ctx = ssl.create_default_context(cadata=k8s_sim.ca_pem)
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", k8s_sim.port)),
                         server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET / HTTP/9.9\r\n\r\n")
        assert b"Error" in tls.recv(200)  # stdlib error page; the connection is dropped
    assert kube.core.list_namespace().items


def test_cli_runs_until_sigterm(tmp_path: Path) -> None:
    kubeconfig, ready = tmp_path / "kc.yaml", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodepool_k8s.dev.simulator", "--kubeconfig", str(kubeconfig),
         "--ready-file", str(ready), "--start-delay", "0", "--error-rate", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(ready.exists, message="the simulator's ready file")
        url = ready.read_text().strip()
        assert url.startswith("https://127.0.0.1:")
        kube = connect(str(kubeconfig))
        try:
            assert kube.core.list_namespace().items
        finally:
            kube.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assert f"listening on {url}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_admin_is_not_affected_by_missing_rbac(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "adm"}})
    with pytest.raises(ApiException) as info:
        kube.core.read_namespaced_pod("none", "adm")
    assert info.value.status == 404


def test_the_server_goes_away_and_comes_back(k8s_sim: Simulator) -> None:
    """`stop_serving` refuses connections (the objects stay), `resume_serving` listens on
    the same address again."""
    conn = https(k8s_sim)
    assert call(conn, "POST", "/api/v1/namespaces", k8s_sim.admin_token,
                {"metadata": {"name": "kept"}})[0] == 201
    conn.close()
    url = k8s_sim.url
    k8s_sim.stop_serving()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", k8s_sim.port), timeout=5).close()
    k8s_sim.resume_serving()
    assert k8s_sim.url == url
    status, body = call(https(k8s_sim), "GET", "/api/v1/namespaces/kept",
                        k8s_sim.admin_token)
    assert status == 200 and body["metadata"]["name"] == "kept"


def test_a_frozen_server_accepts_and_never_answers(k8s_sim: Simulator) -> None:
    """`freeze` keeps accepting connections (TLS included) but answers nothing and applies
    nothing; `thaw` answers again, and the held request's connection ends unanswered."""
    k8s_sim.freeze()
    assert k8s_sim.frozen
    ctx = ssl.create_default_context(cadata=k8s_sim.ca_pem)
    held = http.client.HTTPSConnection("127.0.0.1", k8s_sim.port, context=ctx, timeout=0.5)
    with pytest.raises(TimeoutError):
        call(held, "POST", "/api/v1/namespaces", k8s_sim.admin_token,
             {"metadata": {"name": "never"}})
    k8s_sim.thaw()
    assert not k8s_sim.frozen
    status, _ = call(https(k8s_sim), "GET", "/api/v1/namespaces/never", k8s_sim.admin_token)
    assert status == 404  # the request read while frozen was not applied
    assert call(https(k8s_sim), "POST", "/api/v1/namespaces", k8s_sim.admin_token,
                {"metadata": {"name": "later"}})[0] == 201


def test_a_rotated_ca_is_served_to_new_connections(k8s_sim: Simulator) -> None:
    """After `rotate_ca` the old CA no longer verifies the server, the new one does; open
    connections are cut; the session's shared material is untouched."""
    old = k8s_sim.ca_pem
    assert old is not None
    shared = Path(k8s_sim.config.tls_material_dir or "") / "ca.pem"
    new = k8s_sim.rotate_ca()
    assert new != old and k8s_sim.ca_pem == new
    assert shared.read_text() == old
    stale = http.client.HTTPSConnection(
        "127.0.0.1", k8s_sim.port, context=ssl.create_default_context(cadata=old), timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        call(stale, "GET", "/version", None)
    assert call(https(k8s_sim), "GET", "/version", None)[0] == 200
    doc = yaml.safe_load(Path(k8s_sim.write_kubeconfig(
        Path(k8s_sim.kubeconfig_path or "").with_name("rotated"))).read_text())
    data = doc["clusters"][0]["cluster"]["certificate-authority-data"]
    assert base64.b64decode(data).decode() == new

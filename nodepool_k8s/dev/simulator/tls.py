"""Throwaway TLS material for the simulator, made with the `openssl` command line tool.

Owns: creating a private CA and a server certificate for 127.0.0.1/localhost signed by it (EC
P-256 keys: generating them takes milliseconds, unlike RSA), reading such material back for
reuse, and the server-side SSLContext. Fails with `TlsError` when openssl is missing or refuses
(its stderr is included) or when material to reuse is incomplete.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


class TlsError(RuntimeError):
    """The TLS material could not be made."""


@dataclass(frozen=True)
class TlsMaterial:
    ca_pem: str
    ca_file: str
    cert_file: str
    key_file: str


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise TlsError("openssl not found: install it or run the simulator with tls=False")
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_tls_material(directory: str, hosts: tuple[str, ...] = ("127.0.0.1",)) -> TlsMaterial:
    """Write ca.pem, server.pem and server.key into `directory` and return their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = d / "ca.key", d / "ca.pem"
    key, csr, crt, ext = d / "server.key", d / "server.csr", d / "server.pem", d / "ext.cnf"
    alt_names = ["DNS:localhost", "IP:::1"]
    for host in hosts:
        is_ip = host.replace(".", "").isdigit() or ":" in host
        alt_names.insert(0, f"IP:{host}" if is_ip else f"DNS:{host}")
    ext.write_text(f"subjectAltName={','.join(dict.fromkeys(alt_names))}\n"
                   "extendedKeyUsage=serverAuth\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   # Strict verifiers (Python 3.13+, Go) want key identifiers on the leaf.
                   "subjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid,issuer\n")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    _openssl("req", "-x509", *curve, "-nodes", "-days", "30", "-subj",
             "/CN=nodepool-k8s-sim-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(ca_key), "-out", str(ca_crt))
    _openssl("req", *curve, "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(crt))
    for private in (ca_key, key):
        private.chmod(0o600)
    return TlsMaterial(ca_pem=ca_crt.read_text(), ca_file=str(ca_crt), cert_file=str(crt),
                       key_file=str(key))


def load_tls_material(directory: str) -> TlsMaterial:
    """The material an earlier `make_tls_material(directory)` wrote; `TlsError` if a file
    is missing."""
    d = Path(directory)
    files = (d / "ca.pem", d / "server.pem", d / "server.key")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise TlsError(f"TLS material missing: {', '.join(missing)}")
    ca_crt, crt, key = files
    return TlsMaterial(ca_pem=ca_crt.read_text(), ca_file=str(ca_crt), cert_file=str(crt),
                       key_file=str(key))


def server_context(material: TlsMaterial) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(material.cert_file, material.key_file)
    # Only HTTP/1.1: Go clients (kubectl) would otherwise try h2, which this server lacks.
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx

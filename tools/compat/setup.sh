#!/usr/bin/env bash
# Build (or refresh) the isolated environments the compatibility checks run in.
#
#   .compat-venv/                 Zuul 14.3.0 (installed --no-deps, plus what its ZooKeeper,
#                                 model and executor modules import) and nodepool_k8s itself
#                                 (editable), so tools/compat/*.py can start our stack.
#   .compat-venv/nodepool-env/    Nodepool 11.0.0 with its declared dependencies (it pins
#                                 kazoo==2.9.0, which conflicts with ours, >=2.10) plus
#                                 cachetools, which it imports without declaring it, and
#                                 kubernetes<37 (its k8s driver breaks on 37.x).
#
# Idempotent: a step whose stamp file exists is skipped; delete .compat-venv to start over.
# Needs python3.11 and access to PyPI (or the configured mirror). Nothing here is part of
# the test suite.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.compat-venv"
NPENV="$VENV/nodepool-env"
PYTHON="${PYTHON:-python3.11}"
ZUUL_VERSION="14.3.0"
NODEPOOL_VERSION="11.0.0"

step() { echo "== $*"; }
stamp() { [ -f "$1/.stamp-$2" ]; }
mark() { touch "$1/.stamp-$2"; }

if [ ! -x "$VENV/bin/python" ]; then
    step "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if ! stamp "$VENV" pip; then
    "$VENV/bin/pip" install -q --upgrade pip wheel
    mark "$VENV" pip
fi

if ! stamp "$VENV" zuul-$ZUUL_VERSION; then
    step "installing zuul==$ZUUL_VERSION (--no-deps) and the modules it imports"
    "$VENV/bin/pip" install -q --no-deps "zuul==$ZUUL_VERSION"
    # zuul.zk, zuul.model, zuul.nodepool, zuul.zk.event_queues and
    # zuul.executor.server (for its kubeconfig builder) import these.
    "$VENV/bin/pip" install -q \
        "kazoo>=2.10,<2.12" PyYAML cachetools cryptography google-re2 jsonpath-rw mmh3 \
        netaddr pbr prettytable psutil python-dateutil statsd voluptuous extras urllib3 \
        requests opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc \
        opentelemetry-exporter-otlp-proto-http pyjwt GitPython paramiko prometheus-client apscheduler
    mark "$VENV" zuul-$ZUUL_VERSION
fi

step "installing nodepool_k8s (editable) from $ROOT"
"$VENV/bin/pip" install -q -e "$ROOT"

if [ ! -x "$NPENV/bin/python" ]; then
    step "creating $NPENV"
    "$PYTHON" -m venv "$NPENV"
fi
if ! stamp "$NPENV" nodepool-$NODEPOOL_VERSION; then
    step "installing nodepool==$NODEPOOL_VERSION and its dependencies"
    "$NPENV/bin/pip" install -q --upgrade pip wheel
    # With its declared dependencies (every driver package is imported at start, the
    # launcher refuses to run otherwise), plus cachetools, which it imports without
    # declaring it. kubernetes is held below 37: 37.x (pydantic v2) rejects the RoleBinding
    # body Nodepool 11 sends ("userNames: Extra inputs are not permitted"), so every k8s
    # launch of an unpinned install fails.
    "$NPENV/bin/pip" install -q "nodepool==$NODEPOOL_VERSION" cachetools "kubernetes<37"
    mark "$NPENV" nodepool-$NODEPOOL_VERSION
fi

step "checking imports"
"$VENV/bin/python" - <<'PY'
import zuul.zk, zuul.zk.nodepool, zuul.nodepool, zuul.model  # noqa: F401
import nodepool_k8s.launcher.daemon  # noqa: F401
print("compat venv: zuul", __import__("zuul.version").version.release_string
      if hasattr(__import__("zuul.version").version, "release_string") else "ok")
PY
"$NPENV/bin/python" - <<'PY'
from nodepool.driver import Drivers
Drivers.load()
import nodepool.launcher, nodepool.cmd.nodepoolcmd  # noqa: F401
print("nodepool env: drivers", sorted(Drivers.drivers))
PY
echo "ready: $VENV/bin/python tools/compat/zuul_client_check.py"
echo "       $VENV/bin/python tools/compat/nodepool_side_by_side.py"
echo "       $VENV/bin/python tools/compat/burst_side_by_side.py"

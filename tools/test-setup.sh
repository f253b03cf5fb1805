#!/usr/bin/env bash
# Idempotent set-up for tests, the demo and the benchmark on a Debian machine:
# - Debian's zookeeper (and a JRE, openssl, chromium, kubectl when available) via apt
# - a virtual environment in .venv with nodepool_k8s installed in editable mode plus test extras
# Options: --system-only  only the apt part (tox manages its own virtualenv)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The status page test renders `/` in a real headless browser.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "test-setup: installing ${need_apt[*]} with apt" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${1:-}" = "--system-only" ]; then exit 0; fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# Re-install only when the packaging metadata changed since the last run.
stamp=.venv/.nodepool_k8s-setup.cfg
if ! cmp -s setup.cfg "$stamp" 2>/dev/null; then
    .venv/bin/pip install -q --upgrade pip >/dev/null
    .venv/bin/pip install -q -e '.[test]'
    cp setup.cfg "$stamp"
fi

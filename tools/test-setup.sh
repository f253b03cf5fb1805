#!/usr/bin/env bash
# Idempotent set-up for tests, the demo and the benchmark on a Debian machine:
# - Debian's zookeeper (and a JRE, openssl, chromium) via apt
# - kubectl with kustomize v5 (tests/ops/test_kustomize.py), from the Kubernetes release
#   downloads into /usr/local/bin when no recent one is on PATH (Debian's is 1.20)
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

# kubectl: the pinned release, checked against its published SHA-256, unless the kubectl on
# PATH already embeds kustomize v5 or later.
KUBECTL_VERSION=${KUBECTL_VERSION:-v1.32.4}
kustomize_major=""
if command -v kubectl >/dev/null 2>&1; then
    kustomize_major=$( (kubectl version --client -o json 2>/dev/null || true) \
        | sed -n 's/.*"kustomizeVersion": *"v\{0,1\}\([0-9][0-9]*\)\..*/\1/p')
fi
if [ -z "$kustomize_major" ] || [ "$kustomize_major" -lt 5 ]; then
    case "$(uname -m)" in
        x86_64) arch=amd64 ;;
        aarch64|arm64) arch=arm64 ;;
        *) echo "test-setup: no kubectl download for $(uname -m); install kubectl yourself" >&2
           exit 1 ;;
    esac
    command -v curl >/dev/null 2>&1 || {
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq curl >/dev/null
    }
    echo "test-setup: installing kubectl $KUBECTL_VERSION in /usr/local/bin" >&2
    tmp=$(mktemp -d)
    url="https://dl.k8s.io/release/$KUBECTL_VERSION/bin/linux/$arch/kubectl"
    curl -fsSL -o "$tmp/kubectl" "$url"
    curl -fsSL -o "$tmp/kubectl.sha256" "$url.sha256"
    echo "$(cat "$tmp/kubectl.sha256")  $tmp/kubectl" | sha256sum --check --quiet
    $SUDO install -m 0755 "$tmp/kubectl" /usr/local/bin/kubectl
    rm -rf "$tmp"
    hash -r
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

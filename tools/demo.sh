#!/usr/bin/env bash
# The local demo: set up (apt zookeeper + .venv, idempotent), then run nodepool-launcher
# against a real ZooKeeper and the simulated Kubernetes API, submit requests like Zuul,
# show `nodepool list`, release the nodes and stop everything.
# Options are passed on: --timeout SECONDS, --keep (keep logs). See nodepool_k8s/dev/testing/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/test-setup.sh
exec .venv/bin/python -m nodepool_k8s.dev.testing.demo "$@"

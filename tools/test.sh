#!/usr/bin/env bash
# The one test command: set up everything (apt + venv), check the project's rules (flake8,
# mypy --strict, import-linter contracts), then run the whole suite. Any failure fails it.
# Extra arguments are passed to pytest (after ours: `-n 0` runs in one process).
# Two worker processes (pytest-xdist), one per core: the tests mostly wait, so the suite takes
# about half the wall time. `worksteal` lets an idle worker take queued tests from the other,
# so a few long end-to-end tests at the end do not leave one worker idle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/test-setup.sh
echo "test.sh: flake8" >&2
.venv/bin/flake8 nodepool_k8s tests tools
echo "test.sh: mypy --strict nodepool_k8s" >&2
.venv/bin/mypy nodepool_k8s
echo "test.sh: import contracts" >&2
.venv/bin/lint-imports
exec .venv/bin/python -m pytest -n 2 --dist worksteal "$@"

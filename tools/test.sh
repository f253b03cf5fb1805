#!/usr/bin/env bash
# The one test command: set up everything (apt + venv), check the project's rules (flake8,
# mypy --strict, import-linter contracts) and run the whole suite. Any failure fails it.
# Extra arguments are passed to pytest (after ours: `-n 0` runs in one process).
# Three worker processes (pytest-xdist) on two cores: the tests mostly wait (on ZooKeeper, the
# API simulator, subprocesses), so a third worker fills the idle core time (measured on two
# cores: 244 s with two workers, 179 s with three). `worksteal` lets an idle worker take
# queued tests from the others, so a few long end-to-end tests at the end do not leave one
# worker idle.
# The static checks run beside the tests for the same reason (the tests leave a core idle
# most of the time); their output is printed, and judged, once both are done.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/test-setup.sh

checks_log=$(mktemp "${TMPDIR:-/tmp}/nodepool-k8s-checks.XXXXXX")
trap 'rm -f "$checks_log"' EXIT
(
    set -e
    echo "test.sh: flake8"
    .venv/bin/flake8 nodepool_k8s tests tools
    echo "test.sh: mypy --strict nodepool_k8s"
    .venv/bin/mypy nodepool_k8s
    echo "test.sh: import contracts"
    .venv/bin/lint-imports
) >"$checks_log" 2>&1 &
checks_pid=$!

tests_rc=0
.venv/bin/python -m pytest -n 3 --dist worksteal "$@" || tests_rc=$?
checks_rc=0
wait "$checks_pid" || checks_rc=$?

echo "test.sh: static checks (run beside the tests):" >&2
cat "$checks_log" >&2
if [ "$checks_rc" -ne 0 ]; then
    echo "test.sh: a static check failed (exit $checks_rc, see above)" >&2
fi
if [ "$tests_rc" -ne 0 ]; then
    echo "test.sh: pytest failed (exit $tests_rc)" >&2
    exit "$tests_rc"
fi
exit "$checks_rc"

#!/usr/bin/env bash
# The one test command: set up everything (apt + venv) and run the whole suite.
# Extra arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/test-setup.sh
exec .venv/bin/python -m pytest "$@"

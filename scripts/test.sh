#!/usr/bin/env bash
# Set everything up (idempotent; reuses the cached llama-cpp-python build), check the code with ruff
# and run the whole test suite against the real bundled models. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"` for the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
EDGESPEC_WITH_TESTS=1 bash scripts/setup.sh
.venv/bin/ruff check .
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# The test command (README, .ci/run): set up .venv if needed, lint (ruff, then the import
# contracts of pyproject.toml), build the docs site (mkdocs.yml; --strict: a broken link or a
# page missing from nav fails), run the test suite on CPU.
#
#   ./scripts/test.sh --quick [PYTEST ARGS]   the fast tier, for the edit-test loop: lint and
#       the tests that start no worker process, server or client (not marked `real` or
#       `slow`: tests/conftest.py), with no docs build and no tritonserver or Chromium
#       set-up; a test there that starts a worker fails, saying so.
#
# Both run the tests on pytest-xdist workers (`-n`; pass `-n 0` to run them in one process):
# the tests sharing a fixture wider than a test run on one worker (`--dist loadgroup`, the
# groups are set in tests/conftest.py), and each worker has its own lock folder.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
scripts/bootstrap.sh
if [ "$quick" = 0 ]; then
  scripts/setup-chromium.sh   # for the report picture test; skipped where it cannot install
  scripts/setup-triton.sh     # tritonserver for tests/triton; skipped where it cannot install
fi
.venv/bin/ruff check hotreload tests benchmarks examples
.venv/bin/lint-imports --no-cache   # [tool.importlinter] in pyproject.toml
# Three workers, measured on 2 cores: the tests mostly wait on the processes they start (a
# worker importing torch, a server), so one more worker than cores still pays off; a fourth
# gained little more and made tests that wait on a busy machine late.
WORKERS=(-n 3 --dist loadgroup)
if [ "$quick" = 1 ]; then
  HOTRELOAD_TEST_TIER=quick exec .venv/bin/python -m pytest "${WORKERS[@]}" \
    -m "not real and not slow" "$@"
fi
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet   # docs/ into site/ (ignored)
.venv/bin/python -m pytest "${WORKERS[@]}" "$@"

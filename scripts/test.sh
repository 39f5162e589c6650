#!/usr/bin/env bash
# The test command (README, .ci/run): set up .venv if needed, lint (ruff, then the import
# contracts of pyproject.toml), build the docs site (mkdocs.yml; --strict: a broken link or a
# page missing from nav fails), run the test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/setup-chromium.sh   # for the report picture test; skipped where it cannot install
scripts/setup-triton.sh     # tritonserver for tests/triton; skipped where it cannot install
.venv/bin/ruff check hotreload tests benchmarks examples
.venv/bin/lint-imports --no-cache   # [tool.importlinter] in pyproject.toml
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet   # docs/ into site/ (ignored)
.venv/bin/python -m pytest "$@"

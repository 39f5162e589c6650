#!/usr/bin/env bash
# Create .venv and install hotreload with the pinned CI dependencies (CPU torch 2.13.0).
# Idempotent: re-installs only when requirements-ci.txt or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A .venv without a working pip is a set-up cut short (Ctrl-C during `venv`): start again.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
  "$PY" -m venv .venv
fi
stamp=.venv/.hotreload-deps
want=$(cat requirements-ci.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # Said before the wait, not after: a minute of silence reads as a hang.
  echo "setting up .venv: installing the pinned dependencies of requirements-ci.txt (torch" \
    "2.13.0 CPU build, textual, numpy, aiohttp, ...) and hotreload itself; the first time" \
    "this takes about a minute (torch alone is a few hundred MB to unpack)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-ci.txt
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi

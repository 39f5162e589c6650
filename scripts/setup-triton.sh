#!/usr/bin/env bash
# Test set-up: the tritonserver of the nvidia-pytriton wheel, for the tests marked `triton`
# (tests/triton/). --no-deps: the wheel asks for numpy 1.26, which would replace the pinned
# numpy 2 under torch; its server's Python gets numpy 1.26 in an environment of its own
# (.venv/triton-python, hotreload/export/local_triton.py). Never fails: without the wheel
# those tests skip and say why.
set -u
cd "$(dirname "$0")/.."
PYTRITON=nvidia-pytriton==0.7.0
if ! .venv/bin/python -c "import importlib.util as u; assert u.find_spec('pytriton')" >/dev/null 2>&1; then
  echo "setting up tests: installing $PYTRITON (tritonserver 2.51, about 55 MB) with" \
    "--no-deps, so the pinned torch and numpy stay" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "$PYTRITON" \
    || { echo "$PYTRITON could not be installed: the triton tests will skip" >&2; exit 0; }
fi
.venv/bin/python -c "from hotreload.export.local_triton import ensure_python_env as e; e()" \
  || echo "the tritonserver's Python environment could not be made: triton tests may fail" >&2
exit 0

#!/usr/bin/env bash
# Create .venv and install hotreload with one of two pinned dependency sets (CPU torch 2.13.0):
#
#   scripts/bootstrap.sh demo          requirements-demo.txt: what `hotreload watch` runs
#                                      (torch, textual, numpy, aiohttp, ...); demo.sh runs this
#   scripts/bootstrap.sh [ci]          requirements-ci.txt: the demo's set plus the test tools and
#                                      the extras' packages (Ray, lm-eval, MkDocs, ...); test.sh
#   scripts/bootstrap.sh --check SET   install nothing; exit 0 when SET has nothing to install
#
# Idempotent: a stamp per set in .venv holds a digest of the files it was installed from, and
# a set is installed again only when one of them changed. requirements-ci.txt includes
# requirements-demo.txt, so after the tests' set-up the demo installs nothing, and after the
# demo's the tests add only what the demo lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
set_name=ci
check=0
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    demo | ci) set_name=$arg ;;
    *)
      echo "bootstrap.sh: unknown argument '$arg' (expected demo, ci or --check)" >&2
      exit 2
      ;;
  esac
done

digest() { cat "$@" | sha256sum | cut -d' ' -f1; }
demo_stamp=.venv/.hotreload-deps-demo
ci_stamp=.venv/.hotreload-deps-ci
want_demo=$(digest requirements-demo.txt pyproject.toml)
want_ci=$(digest requirements-demo.txt requirements-ci.txt pyproject.toml)
stamped() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }
# The tests' set holds the demo's: either stamp serves the demo.
demo_ready() { stamped "$demo_stamp" "$want_demo" || stamped "$ci_stamp" "$want_ci"; }
ci_ready() { stamped "$ci_stamp" "$want_ci"; }
# A .venv without a working pip is a set-up cut short (Ctrl-C during `venv`): start again.
venv_ok() { [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; }

if [ "$check" = 1 ]; then
  venv_ok && "${set_name}_ready"
  exit
fi
if ! venv_ok; then
  rm -rf .venv
  "$PY" -m venv .venv
fi
"${set_name}_ready" && exit 0

pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
# Said before the wait, not after: a minute of silence reads as a hang.
if [ "$set_name" = demo ]; then
  echo "setting up .venv for the demo: installing the pinned dependencies of" \
    "requirements-demo.txt (torch 2.13.0 CPU build, textual, numpy, aiohttp, ...) and" \
    "hotreload itself; the first time this takes about a minute (torch alone is a few" \
    "hundred MB to unpack). ./scripts/test.sh adds the test tools and extras later." >&2
  pip_install -r requirements-demo.txt
  pip_install --no-deps -e .
  echo "$want_demo" >"$demo_stamp"
  exit 0
fi
if demo_ready; then
  echo "setting up .venv for the tests: adding to the demo's set the pinned test tools and" \
    "extras of requirements-ci.txt (pytest, transformers, Ray, lm-eval, MkDocs, ...); the" \
    "first time this takes one to two minutes" >&2
else
  echo "setting up .venv for the tests: installing the pinned dependencies of" \
    "requirements-ci.txt (torch 2.13.0 CPU build, textual, numpy, aiohttp, ..., then the" \
    "test tools and extras: pytest, transformers, Ray, lm-eval, MkDocs, ...) and hotreload" \
    "itself; the first time this takes about two minutes" >&2
fi
pip_install -r requirements-ci.txt
pip_install --no-deps -e .
echo "$want_ci" >"$ci_stamp"

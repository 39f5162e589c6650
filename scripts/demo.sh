#!/usr/bin/env bash
# The main job on the bundled example: set up .venv if needed (the demo's set only,
# requirements-demo.txt; ./scripts/test.sh adds the rest), then serve a copy of
# examples/mlp and reload it on every save. The copy lives in demo/mlp (git ignores demo/),
# so the demo never changes a file the repository tracks.
#
#   ./scripts/demo.sh            serve demo/mlp (made from examples/mlp the first time)
#   ./scripts/demo.sh --fresh    start again from examples/mlp (your edits in demo/mlp go)
#   ./scripts/demo.sh --no-tui   any other option goes to `hotreload watch`
set -euo pipefail
cd "$(dirname "$0")/.."
work=${HOTRELOAD_DEMO_DIR:-demo}/mlp
fresh=0
args=()
for arg in "$@"; do
  if [ "$arg" = --fresh ]; then fresh=1; else args+=("$arg"); fi
done
scripts/bootstrap.sh demo
if [ "$fresh" = 1 ] || [ ! -f "$work/hotreload.toml" ]; then
  rm -rf "$work"
  mkdir -p "$(dirname "$work")"
  cp -R examples/mlp "$work"
  rm -rf "$work/.hotreload" "$work/__pycache__"  # a copy, not the example's session state
  echo "demo: copied examples/mlp to $work/ (git ignores it; examples/ stays as committed)" >&2
else
  echo "demo: serving $work/ with your edits (./scripts/demo.sh --fresh starts again)" >&2
fi
echo "demo: edit $work/model.py (say SCALE = 2.0) and save: the golden panel says how far" \
  "the answers moved (hotreload diff mlp --config $work/hotreload.toml); new weights:" \
  ".venv/bin/python $work/make_weights.py --seed 1; b in the dashboard (or" \
  "hotreload rollback mlp --config $work/hotreload.toml) serves the version before again" >&2
exec .venv/bin/hotreload watch --config "$work/hotreload.toml" ${args[@]+"${args[@]}"}

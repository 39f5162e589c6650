#!/usr/bin/env bash
# The main job on the bundled example: set up .venv if needed, then serve examples/mlp
# and reload it on every save. Edit examples/mlp/model.py in another window.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/hotreload watch --config examples/mlp/hotreload.toml "$@"

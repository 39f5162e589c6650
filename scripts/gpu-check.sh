#!/usr/bin/env bash
# Runs the GPU-only checks on a machine with an NVIDIA GPU, in about eight minutes:
#   1. the pytest tests marked `gpu` (NVML vs torch, busy streams, memory back to baseline,
#      weights read straight onto the device, pushes over CUDA IPC and a memfd, code edits
#      sharing the device weights);
#   2. `hotreload doctor`, for the record;
#   3. one real reload loop of the example model on CUDA;
#   4. benchmarks/cuda_chunks.py: 2,000 CUDA tensors pushed by one handle each (torch's
#      own IPC) and by hotreload's chunks, side by side (figures only, never a failure).
#   5. a `torch.compile(mode="reduce-overhead")` model: its CUDA graphs re-captured in the
#      warm phase of a reload, never on a request (tests/gpu/test_compiled_gpu.py).
# Usage: scripts/gpu-check.sh            (from anywhere; uses .venv/bin/python if present)
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU found (nvidia-smi -L failed); nothing to check" >&2
  exit 3
fi
nvidia-smi -L

# Each step has its own budget; together they stay under ten minutes.
step() {
  local budget=$1; shift
  echo "== $* (limit ${budget}s)"
  timeout --kill-after=10 "$budget" "$@"
}

step 200 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests \
  --ignore=tests/gpu/test_compiled_gpu.py
step 30 "$PY" -m hotreload doctor || echo "gpu-check: doctor reported a FAIL (see above)"
HOTRELOAD_DEVICE=cuda:0 step 100 "$PY" -m hotreload check \
  --config examples/mlp/hotreload.toml --reloads 3
step 120 "$PY" benchmarks/cuda_chunks.py --tensors 2000 --mib 256 \
  || echo "gpu-check: benchmarks/cuda_chunks.py did not finish (see above)"
# Inductor compiles the model's graphs (a minute or two the first time on a cold cache).
step 240 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_compiled_gpu.py
echo "gpu-check: all GPU checks passed"

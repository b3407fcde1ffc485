#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, install what it needs and measure everything the
# GPU path promises (bench/gpu_check.py says what). Writes gpu_check/gpu_check.{json,md}.
#
#   bash bench/gpu_check.sh [OUT_DIR]            # on a CUDA machine (a session's device: see README "On a GPU")
#   bash bench/gpu_check.sh [OUT_DIR] --dry-run  # the CPU-safe parts on tiny sizes (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check}"
if [ "${2:-}" = "--dry-run" ] || [ "${1:-}" = "--dry-run" ]; then
  [ "${1:-}" = "--dry-run" ] && out=gpu_check
  exec "${PYTHON:-python}" bench/gpu_check.py "$out" --dry-run
fi
# look before downloading ~5 GB of CUDA wheels: a machine without a CUDA GPU is told so in one line
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "error: no CUDA GPU here (nvidia-smi finds none); bash bench/gpu_check.sh OUT_DIR --dry-run runs the CPU-safe parts" >&2
  exit 2
fi
python3 -m venv .venv-gpu
# torch with CUDA from PyPI (its default build), then the project, its test tools and reservoirpy
.venv-gpu/bin/pip install -q torch
.venv-gpu/bin/pip install -q -e . -r requirements-dev.txt reservoirpy
.venv-gpu/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'"
exec .venv-gpu/bin/python bench/gpu_check.py "$out"

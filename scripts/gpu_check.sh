#!/usr/bin/env bash
# make gpu-check: everything a GPU machine can prove about fastload's device path, in one command, within
# ten minutes, every output under one results folder.
#
#   scripts/gpu_check.sh [RESULTS_DIR]     default: $OUT/gpu-check if $OUT is set (the device tool's
#                                          folder that comes back), else bench/results/gpu-check
#
# On a bare GPU machine with a CUDA torch (the lent machines: Python 3.12, torch cu130, torchvision, no
# network, no lmdb, no DALI): what is missing comes from the wheels carried in `.gpu/` (made here by
# `../shared/gpu/prepare.sh`, see shared/gpu/README.md; `.gpu/setup.sh` installs them into /tmp/site and
# builds the native extension in place; DALI parts copied to /tmp/dali-parts are unpacked too). Then:
#   1. env.txt          GPU, driver, torch/CUDA, torchvision and DALI as they import
#   2. sim.txt          the simulated-GPU tests (stream protocol, pageable syncs, GPU decoders on the sim)
#   3. lag.txt          tests/cuda/test_gpu_lag.py: forced lag, device-side comparison, allocator trap,
#                       stream switch, GPU decoders with a corrupt JPEG, the configuration matrix
#   4. sync.txt         tests/cuda/test_gpu_sync.py: next() latency with 100 ms queued, sync debug "error";
#                       tests/cuda/test_gpu_decoder_streams.py: GPU decoders' decode() with their stream busy
#   5. cuda.txt         the rest of tests/cuda (values, layouts, the ResNet-18 stress run)
#   6. augment_gpu_bench.md  bench/augment_gpu_bench.py --engine-only: the batched augmentation engine per batch
#   7. gpu_bench.md     bench/gpu_bench.py (quick sizes), written even when DALI or torchvision is missing
#   summary.txt         one line per step with its exit status and seconds; the script exits non-zero
#                       when any step failed or no CUDA device was found
# GPU_CHECK_SECONDS (default 570) is the whole budget; each step gets what is left, less a reserve for
# the steps after it, and is stopped (status 124) when it runs out.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
results=${1:-${OUT:+$OUT/gpu-check}}
results=${results:-bench/results/gpu-check}
mkdir -p "$results"
results=$(cd "$results" && pwd)
budget=${GPU_CHECK_SECONDS:-570}
t0=$(date +%s)
PY=${PYTHON:-python3}
: > "$results/summary.txt"
failed=0

left() { echo $(( budget - ($(date +%s) - t0) )); }

# step NAME RESERVE CMD...: run CMD with the time left minus RESERVE seconds (kept for later steps)
step() {
  local name=$1 reserve=$2; shift 2
  local limit=$(( $(left) - reserve ))
  if [ "$limit" -lt 10 ]; then
    echo "$name: not run (the ${budget}s budget is spent)" | tee -a "$results/summary.txt"
    failed=1
    return
  fi
  local s=$(date +%s)
  echo "== $name (up to ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$results/$name.txt" 2>&1
  local rc=$?
  tail -n 3 "$results/$name.txt"
  echo "$name: exit $rc, $(( $(date +%s) - s ))s" | tee -a "$results/summary.txt"
  [ "$rc" -eq 0 ] || failed=1
}

# -- install what is missing, build -------------------------------------------------------------------
if [ -f .gpu/setup.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/setup.sh > "$results/setup.txt" 2>&1 || echo "setup: .gpu/setup.sh failed (see setup.txt)" | tee -a "$results/summary.txt"
elif ! "$PY" -c "import fastload._C" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . > "$results/setup.txt" 2>&1 \
    || echo "setup: building fastload failed (see setup.txt); carry .gpu/ (../shared/gpu/prepare.sh)" | tee -a "$results/summary.txt"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" - > "$results/env.txt" 2>&1 <<'PY'
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(), "| count", torch.cuda.device_count())
for name in ("torchvision", "nvidia.dali", "lmdb", "fastload._C"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "ok"))
    except Exception as e:  # any failure: the module is unusable here
        print(name, "unusable:", type(e).__name__, e)
PY
cat "$results/env.txt"
nvidia-smi >> "$results/env.txt" 2>&1 || true
cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

# -- tests, then the benchmark (quick sizes: the whole check fits in ten minutes) ----------------------
step sim 420 "$PY" -m pytest -q -p no:cacheprovider tests/test_sim_streams.py tests/test_ring.py tests/test_gpu_decoders_sim.py \
  tests/decoders/test_staging.py tests/decoders/test_augment_sim.py
step lag 300 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_gpu_lag.py
step sync 210 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_gpu_sync.py tests/cuda/test_gpu_decoder_streams.py
step cuda 180 "$PY" -m pytest -q -p no:cacheprovider tests/cuda --ignore=tests/cuda/test_gpu_lag.py \
  --ignore=tests/cuda/test_gpu_sync.py --ignore=tests/cuda/test_gpu_decoder_streams.py
step augment_bench 150 "$PY" bench/augment_gpu_bench.py --engine-only --batch-size 128 --rounds 10 \
  --out "$results/augment_gpu_bench.md"
step gpu_bench 0 "$PY" bench/gpu_bench.py --per-class 40 --batch-size 128 --steps 20 --data /tmp/fastload-gpu-data \
  --out "$results/gpu_bench.md"

if [ "$cuda" != "1" ]; then
  echo "no CUDA device here: the tests skipped and nothing was measured" | tee -a "$results/summary.txt"
  failed=1
fi
echo "gpu-check: $(( $(date +%s) - t0 ))s, results in $results" | tee -a "$results/summary.txt"
exit "$failed"

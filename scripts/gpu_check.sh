#!/usr/bin/env bash
# make gpu-check: everything a GPU machine can prove about fastload's device path, in one command, within
# ten minutes, every output under one results folder.
#
#   scripts/gpu_check.sh [RESULTS_DIR]     default: $OUT/gpu-check if $OUT is set (the device tool's
#                                          folder that comes back), else bench/results/gpu-check
#
# On a bare GPU machine with a CUDA torch (the lent machines: Python 3.12, torch cu130, torchvision, no
# network, no lmdb, no DALI): what is missing comes from the wheels and debs carried in `.gpu/` (made here by
# `make gpu-prepare`: the shared kit, see ../shared/gpu/README.md, plus fastload's own xxhash/click/tqdm wheels
# and libpng; `.gpu/setup.sh` installs the wheels into /tmp/site and
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
# the steps after it, and is stopped (status 124) when it runs out; a step with under 10 s left is "not run".
# A fastload/_C that does not load for this Python (without .gpu/, or if setup.sh's pip install was refused) is
# built in place (setup.py build_ext --inplace: nothing installed, so neither an externally managed Python nor
# a read-only site-packages stops it). When fastload
# itself does not import (a missing dependency: PIL, xxhash), summary.txt says which, and no step runs.
# tests/test_gpu_check_script.py sources this file (GPU_CHECK_SOURCED=1) to test `step` on its own.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
budget=${GPU_CHECK_SECONDS:-570}
t0=$(date +%s)
PY=${PYTHON:-python3}
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
  local how="exit $rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && how="stopped at its ${limit}s limit (exit $rc)"
  echo "$name: $how, $(( $(date +%s) - s ))s" | tee -a "$results/summary.txt"
  [ "$rc" -eq 0 ] || failed=1
}

# whether fastload/_C for this Python loads, without importing fastload (whose own dependencies are checked apart)
native_loads() {
  "$PY" - <<'PY'
import importlib.machinery as m, importlib.util as u, pathlib, sys, torch  # noqa: F401  (_C links against torch)
so = next(pathlib.Path("fastload").glob("_C" + m.EXTENSION_SUFFIXES[0]), None)
if so is None:
    sys.exit(f"no fastload/_C{m.EXTENSION_SUFFIXES[0]} for this Python: building it")
u.module_from_spec(u.spec_from_file_location("fastload._C", so))
PY
}

# The simulated-GPU test files: the simulator's own, the rings', every *_sim.py, the decoders' staging. By
# pattern, so that a new simulator test file is in the step (tests/test_gpu_check_script.py checks that every
# test module importing the simulator outside tests/cuda is listed, test_accelerate's aside: it needs accelerate).
sim_tests() {
  (cd "$root" && ls tests/test_sim_streams.py tests/test_ring*.py tests/test_*_sim.py tests/decoders/test_*_sim.py \
    tests/decoders/test_staging.py 2>/dev/null)
}

# -- install what is missing, build -------------------------------------------------------------------
setup() {
  # png.h (mask fields link libpng) may be missing where jpeglib.h is not, when .gpu/setup.sh's own fallback
  # does not run: unpack the carried debs (scripts/gpu_prepare.sh) where that fallback puts them.
  if ! echo '#include <png.h>' | g++ -E -x c++ - >/dev/null 2>&1 && ls .gpu/debs/libpng-dev_*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/jpeg && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/jpeg; done
    export CPATH=/tmp/jpeg/usr/include:/tmp/jpeg/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
    export LIBRARY_PATH=/tmp/jpeg/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=/tmp/jpeg/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "setup: png.h missing, using the carried libpng" | tee -a "$results/summary.txt"
  fi
  if [ -f .gpu/setup.sh ]; then
    # shellcheck disable=SC1091
    source .gpu/setup.sh > "$results/setup.txt" 2>&1 || echo "setup: .gpu/setup.sh failed (see setup.txt)" | tee -a "$results/summary.txt"
  fi
  if ! native_loads >> "$results/setup.txt" 2>&1; then
    "$PY" setup.py build_ext --inplace >> "$results/setup.txt" 2>&1 \
      || echo "setup: building fastload failed (see setup.txt); carry .gpu/ (make gpu-prepare)" | tee -a "$results/summary.txt"
  fi
}

env_report() {
  "$PY" - > "$results/env.txt" 2>&1 <<'PY'
import importlib, os, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(), "| count", torch.cuda.device_count())
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
print("cores: os.cpu_count()", os.cpu_count(), "| affinity", cores)
for name in ("fastload", "torchvision", "nvidia.dali", "lmdb", "PIL", "xxhash", "tqdm", "click", "pytest_timeout"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "ok"))
    except Exception as e:  # any failure: the module is unusable here
        print(name, "unusable:", type(e).__name__, e)
PY
  cat "$results/env.txt"
  nvidia-smi >> "$results/env.txt" 2>&1 || true
}

main() {
  cd "$root"
  results=${1:-${OUT:+$OUT/gpu-check}}
  results=${results:-bench/results/gpu-check}
  mkdir -p "$results"
  results=$(cd "$results" && pwd)
  : > "$results/summary.txt"
  setup
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  env_report
  local cuda why
  cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
  if ! why=$("$PY" -c "import fastload._C" 2>&1); then
    # every step would fail on it; say once what is missing instead of six collection errors
    echo "fastload does not import here: $(echo "$why" | tail -n 1); carry what is missing in .gpu/whl" \
      "(../shared/gpu/prepare.sh); no step run" | tee -a "$results/summary.txt"
    echo "gpu-check: $(( $(date +%s) - t0 ))s, results in $results" | tee -a "$results/summary.txt"
    return 1
  fi

  # -- tests, then the benchmark (quick sizes: the whole check fits in ten minutes) --------------------
  # shellcheck disable=SC2046  (a list of paths without spaces)
  step sim 420 "$PY" -m pytest -q -p no:cacheprovider $(sim_tests)
  step lag 300 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_gpu_lag.py
  step sync 210 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_gpu_sync.py tests/cuda/test_gpu_decoder_streams.py
  step cuda 180 "$PY" -m pytest -q -p no:cacheprovider tests/cuda --ignore=tests/cuda/test_gpu_lag.py \
    --ignore=tests/cuda/test_gpu_sync.py --ignore=tests/cuda/test_gpu_decoder_streams.py
  step augment_bench 150 "$PY" bench/augment_gpu_bench.py --engine-only --batch-size 128 --rounds 10 \
    --out "$results/augment_gpu_bench.md"
  # gpu_bench.py writes its file after each section and on the SIGTERM of the step's limit
  step gpu_bench 0 "$PY" bench/gpu_bench.py --per-class 40 --batch-size 128 --steps 20 --data /tmp/fastload-gpu-data \
    --out "$results/gpu_bench.md"

  if [ "$cuda" != "1" ]; then
    echo "no CUDA device here: the tests skipped and nothing was measured" | tee -a "$results/summary.txt"
    failed=1
  fi
  echo "gpu-check: $(( $(date +%s) - t0 ))s, results in $results" | tee -a "$results/summary.txt"
  return "$failed"
}

if [ -z "${GPU_CHECK_SOURCED:-}" ]; then
  main "$@"
  exit $?
fi

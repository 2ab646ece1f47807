#!/usr/bin/env bash
# make gpu-check: everything a lent GPU machine can prove about fastload's device path, in ONE call that fits
# its budget (420 s of wall time, the build included), every result in at most 3 files. docs/GPU.md gives the
# exact device calls, what each file holds and how to read a failure.
#
#   scripts/gpu_check.sh [--dali] [--dry-run] [RESULTS_DIR]
#       RESULTS_DIR   default $OUT (the device tool's folder that comes back) if set, else bench/results/gpu-check
#       --dali        lease 2: DALI's parts, brought to /tmp/dali-parts by the calls before (docs/GPU.md), are
#                     checked against .gpu/dali.manifest and unpacked; only the dali and auto tests run, and
#                     gpu_bench's DALI comparison (loaders, decode)
#       --dry-run     here, without CUDA: every step's setup and collection (pytest --collect-only, the bench's
#                     import and its no-CUDA report), the results' count and sizes and what travels against the
#                     device limits, and the time budget; exits non-zero when any of it fails
#   GPU_CHECK_STEPS=lag,sync      only these test/bench steps (preflight and setup always run; on a warm machine
#                                 setup finds the build and the unpacked DALI and takes seconds)
#   GPU_CHECK_REQUIRE=dali,nvjpeg these decoders must run in full: a test of theirs skipped or none run fails the
#                                 check (default native,nvjpeg; with --dali: dali,auto; empty: none)
#   GPU_CHECK_SECONDS=420         the whole budget; each step also has its own limit (STEP_LIMITS below)
#   GPU_CHECK_LIMITS=lag=200      other step limits, for a rerun of one step that ran out of time
#
# Steps (each stopped at its own limit; the limits sum under the budget; none runs the simulator, CI does):
#   preflight  seconds: CUDA, g++, Python.h, pybind11 >= 2.12 (or a prebuilt _C in .gpu/prebuilt), that a
#              `nvidia` folder on PYTHONPATH is importable beside the machine's own nvidia packages (else a
#              carried DALI is never found), the required decoders' libraries, DALI's parts and manifest
#   setup      .gpu/whl wheels into /tmp/site, the carried libjpeg/libpng when headers are missing, the native
#              core built in place (or the prebuilt _C if the build fails), DALI unpacked (--dali), env report
#   lag        tests/cuda/test_*lag*.py: forced lag, allocator trap, stream switch, GPU decoders under lag
#   sync       test_gpu_sync.py, test_gpu_decoder_streams.py: next() latency, sync debug "error" (fresh processes)
#   cuda       every other tests/cuda/test_*.py (a new file lands here by itself)
#   bench      bench/gpu_bench.py --quick (H2D, correctness under ResNet-18 + lag, loaders, ResNet-50 overlap,
#              decode); --dali: --sections loaders,decode --decoders dali,auto
# Results (written again as each step ends, so a run killed part-way still brings back what finished):
#   summary.txt    one line per step (verdict, seconds used of its limit), one line per decoder (ran, passed,
#                  failed, skipped with the reasons; REQUIRED ones that did not run in full), the budget
#   logs.tar       every step's log, env.txt (GPU, driver, versions), the per-test verdicts (*.verdicts.jsonl)
#   gpu_bench.md   the benchmark's report (written after each of its sections)
# Exit status: 0 when every step passed and every required decoder ran in full.
# tests/test_gpu_check_script.py sources this file (GPU_CHECK_SOURCED=1) to test its parts, and runs --dry-run.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
budget=${GPU_CHECK_SECONDS:-420}
t0=$(date +%s)
failed=0
dry=${dry:-}     # set by main's options; a step's own shell inherits them (step runs `bash -c 'source this; ...'`)
dali=${dali:-}

SITE=${GPU_CHECK_SITE:-/tmp/site}                  # where carried wheels and DALI are installed there
DALI_PARTS=${GPU_CHECK_DALI_PARTS:-/tmp/dali-parts}  # where lease 2's first calls leave DALI's parts

# The device limits (docs/GPU.md, the device tool's README): files back from $OUT, their size, what travels.
MAX_FILES=6          # the issue's bound; the tool brings back 8
MAX_FILE_MIB=16
MAX_TRAVEL_MIB=64
# Each step's own limit in seconds (unmeasured on a GPU so far: estimates, see docs/GPU.md).
declare -A STEP_LIMITS=([preflight]=30 [setup]=100 [lag]=80 [sync]=70 [cuda]=50 [bench]=80)
STEPS=(preflight setup lag sync cuda bench)
# GPU_CHECK_LIMITS=lag=200,sync=150: other limits for a rerun of one step (the budget still applies)
limits=${GPU_CHECK_LIMITS:-}
for kv in ${limits//,/ }; do STEP_LIMITS[${kv%%=*}]=${kv#*=}; done

left() { echo $(( budget - ($(date +%s) - t0) )); }
log() { echo "$*" | tee -a "$logs/steps.txt"; }

# -- the results: summary.txt and logs.tar, rewritten after every step -------------------------------------------
render() {
  {
    echo "gpu-check${dali:+ --dali}${dry:+ --dry-run}: $(date -u +%FT%TZ), $(( $(date +%s) - t0 ))s of the ${budget}s budget"
    [ -f "$logs/device.txt" ] && cat "$logs/device.txt"
    cat "$logs/steps.txt" 2>/dev/null
    if ls "$logs"/*.verdicts.jsonl >/dev/null 2>&1; then
      echo "-- per decoder (tests; GPU_CHECK_REQUIRE=${require:-<none>})"
      "$PY" "$root/tests/cuda/gpu_verdicts.py" "$logs"/*.verdicts.jsonl --require "$require" 2>&1
    fi
    [ -f "$logs/bench-notes.txt" ] && { echo "-- bench: what could not run"; cat "$logs/bench-notes.txt"; }
    [ -f "$logs/final.txt" ] && cat "$logs/final.txt"
    true  # the block's status is not the file's: it is written whatever the last test above said
  } > "$results/summary.txt.tmp" && mv "$results/summary.txt.tmp" "$results/summary.txt"
  tar -cf "$results/logs.tar.tmp" -C "$logs" . 2>/dev/null && mv "$results/logs.tar.tmp" "$results/logs.tar"
}

# step NAME CMD...: run CMD under the step's own limit (less if the budget has less left); log in $logs/NAME.txt
step() {
  local name=$1; shift
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ ",$GPU_CHECK_STEPS," != *",$name,"* ]] && [[ " preflight setup " != *" $name "* ]]; then
    return 0
  fi
  local own=${STEP_LIMITS[$name]:-60} limit
  limit=$(left)
  [ "$own" -lt "$limit" ] && limit=$own
  # a dry run only collects, on whatever machine CI has: the device's limits are checked apart (limits_check)
  [ -n "$dry" ] && limit=${GPU_CHECK_DRY_STEP_SECONDS:-300}
  if [ "$limit" -lt 5 ]; then
    log "$name: NOT RUN (the ${budget}s budget is spent)"; failed=1; render; return 1
  fi
  local s rc how
  s=$(date +%s)
  current=$name
  echo "== $name (up to ${limit}s)"
  # the step's own shell sources this file for its functions; timeout signals its whole process group
  timeout --kill-after=5 "$limit" env GPU_CHECK_SOURCED=1 bash -c 'source "$0"; cd "$root" && "$@"' \
    "$root/scripts/gpu_check.sh" "$@" > "$logs/$name.txt" 2>&1
  rc=$?
  current=""
  tail -n 3 "$logs/$name.txt"
  case $rc in
    0) how="passed" ;;
    124|137) how="STOPPED at its ${limit}s limit (exit $rc)" ;;
    *) how="FAILED (exit $rc; see $name.txt in logs.tar)" ;;
  esac
  log "$name: $how, $(( $(date +%s) - s ))s of ${limit}s"
  [ "$rc" -eq 0 ] || failed=1
  render
  return "$rc"
}

on_signal() {
  log "${current:-gpu-check}: STOPPED by a signal after $(( $(date +%s) - t0 ))s (the call's time limit?)"
  render
  exit 143
}

# -- what each step runs ----------------------------------------------------------------------------------------
lag_files() { (cd "$root" && ls tests/cuda/test_*lag*.py); }
sync_files() { (cd "$root" && ls tests/cuda/test_gpu_sync.py tests/cuda/test_gpu_decoder_streams.py); }
rest_files() {
  local taken
  taken=" $(lag_files | tr '\n' ' ') $(sync_files | tr '\n' ' ') "
  (cd "$root" && for f in tests/cuda/test_*.py; do [[ "$taken" == *" $f "* ]] || echo "$f"; done)
}

# pytest over a step's files: the verdicts plugin writes one line per test; --dali keeps the dali/auto tests
tests_step() {
  local name=$1; shift
  local args=(-m pytest -q -p no:cacheprovider -p gpu_verdicts "--gpu-verdicts=$logs/$name.verdicts.jsonl")
  [ -n "$dali" ] && args+=(--gpu-decoders=dali,auto)
  [ -n "$dry" ] && args+=(--collect-only)
  "$PY" -c "import pytest_timeout" 2>/dev/null && args+=(--timeout=120)
  "$PY" "${args[@]}" "$@"
}

bench_step() {
  local args=(bench/gpu_bench.py --quick --data /tmp/fastload-gpu-data --out "$results/gpu_bench.md")
  [ -n "$dali" ] && args+=(--sections loaders,decode --decoders dali,auto)
  "$PY" "${args[@]}"
  local rc=$?
  grep -h "could not run" "$results/gpu_bench.md" > "$logs/bench-notes.txt" 2>/dev/null || rm -f "$logs/bench-notes.txt"
  return $rc
}

# -- preflight: fail in seconds, with the reason ----------------------------------------------------------------
# pybind11 >= 2.12 for the build: the machine's, or the wheel in .gpu/whl that setup installs first
pybind11_ok() {
  local have wheel
  have=$("$PY" -c "import pybind11; print(pybind11.__version__)" 2>/dev/null)
  wheel=$(ls "$root"/.gpu/whl/pybind11-*.whl 2>/dev/null | head -n 1 | sed -E 's#.*/pybind11-([0-9.]+)-.*#\1#')
  for v in $have $wheel; do
    "$PY" -c "import sys; sys.exit(tuple(int(x) for x in '$v'.split('.')[:2]) < (2, 12))" 2>/dev/null && return 0
  done
  echo "PRECONDITION: pybind11 >= 2.12 needed to build: the machine has '${have:-none}', .gpu/whl '${wheel:-none}'"
  return 1
}

# a `nvidia` folder first on PYTHONPATH must be importable beside the machine's own nvidia packages: if theirs is a
# regular package (an __init__.py without pkgutil.extend_path), it hides $SITE/nvidia/dali and DALI is never found
nvidia_probe() {
  local probe err
  probe=$(mktemp -d /tmp/gpu-check-probe.XXXXXX)
  mkdir -p "$probe/nvidia/fastload_probe" && : > "$probe/nvidia/fastload_probe/__init__.py"
  if ! err=$(PYTHONPATH="$probe${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import nvidia.fastload_probe" 2>&1); then
    echo "PRECONDITION: a carried nvidia/ package is not importable here ($(PYTHONPATH="$probe${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" -c 'import nvidia; print("the nvidia package found first is", getattr(nvidia, "__file__", None), "with __path__", list(nvidia.__path__))' 2>&1 | tail -n 1)): DALI in $SITE would never be found (${err##*$'\n'})"
    rm -rf "$probe"; return 1
  fi
  rm -rf "$probe"
}
prebuilt() { ls "$root"/.gpu/prebuilt/_C"$("$PY" -c 'import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])')" 2>/dev/null; }

preflight() {
  local bad=0 v inc
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
  if [ -z "$dry" ]; then
    v=$("$PY" -c "import torch; print(int(torch.cuda.is_available()), torch.__version__)" 2>&1 | tail -n 1)
    [ "${v%% *}" = 1 ] || { echo "PRECONDITION: no CUDA device for torch ($v): nothing here can be proved"; bad=1; }
  fi
  local build_ok=1
  command -v g++ >/dev/null || { echo "PRECONDITION: no g++ (the native core is C++17)"; build_ok=0; }
  inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  [ -f "$inc/Python.h" ] || { echo "PRECONDITION: no Python.h in $inc (python3-dev)"; build_ok=0; }
  pybind11_ok || build_ok=0
  if [ "$build_ok" = 0 ]; then
    if [ -n "$(prebuilt)" ]; then echo "preflight: cannot build here; the prebuilt $(prebuilt) will be used"
    elif native_loads >/dev/null 2>&1; then echo "preflight: cannot build here; fastload/_C already loads"
    else echo "PRECONDITION: cannot build the native core and no prebuilt _C for this Python in .gpu/prebuilt"; bad=1
    fi
  fi
  # the required decoders' libraries: the machine's; a dry run here reports them without failing
  local lib_bad=0
  if [[ ",$require,$dali," == *",dali,"* || -n "$dali" ]]; then
    nvidia_probe || lib_bad=1
    if [ -n "$dry" ]; then
      dali_parts_check "$root/.gpu-dali" || lib_bad=1
    else
      # parts carried with this call (the last one rides with .gpu/ where it fits) join those brought before
      mkdir -p "$DALI_PARTS" && for f in "$root"/.gpu-dali/p*/part*; do [ -f "$f" ] && cp "$f" "$DALI_PARTS/"; done
      dali_parts_check || lib_bad=1
    fi
  fi
  if [[ ",$require," == *",nvjpeg,"* || ",$require," == *",auto,"* ]] && [ -z "$dali" ]; then
    v=$("$PY" -c "import torchvision.io as io; io.decode_jpeg" 2>&1) \
      || { echo "PRECONDITION: GPU_CHECK_REQUIRE names nvjpeg, but torchvision does not import: ${v##*$'\n'}"; lib_bad=1; }
  fi
  if [ "$lib_bad" = 1 ] && [ -n "$dry" ]; then
    echo "dry run: the PRECONDITION lines above about libraries concern the GPU machine; not counted here"
  elif [ "$lib_bad" = 1 ]; then
    bad=1
  fi
  return $bad
}

# DALI's parts: every part named in .gpu/dali.manifest present in /tmp/dali-parts (here: .gpu-dali/pNN/) with its
# sha256, nothing else; checked before anything is unpacked
dali_parts_check() {
  local manifest=$root/.gpu/dali.manifest dir=${1:-$DALI_PARTS}
  if [ ! -f "$manifest" ]; then
    echo "PRECONDITION: no .gpu/dali.manifest: run \`make gpu-prepare DALI=1\` here and carry .gpu/"; return 1
  fi
  "$PY" - "$manifest" "$dir" <<'PY'
import hashlib, sys
from pathlib import Path
manifest, folder = Path(sys.argv[1]), Path(sys.argv[2])
lines = [ln.split() for ln in manifest.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
want = {name: digest for digest, name in lines}
found = {p.name: p for p in folder.rglob("part*")} if folder.is_dir() else {}
bad = []
missing = sorted(set(want) - set(found))
if missing:
    bad.append(f"{len(missing)} of {len(want)} DALI parts missing in {folder}: {', '.join(missing)} (bring each with "
               "its own call, docs/GPU.md lease 2)")
for name in sorted(set(want) & set(found)):
    h = hashlib.sha256()
    with open(found[name], "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != want[name]:
        bad.append(f"DALI part {name} is corrupt: sha256 {h.hexdigest()[:12]}..., the manifest says {want[name][:12]}...")
extra = sorted(set(found) - set(want))
if extra:
    bad.append(f"DALI parts not in the manifest (another prepare's?): {', '.join(extra)}")
if bad:
    print("PRECONDITION: " + "\nPRECONDITION: ".join(bad))
    sys.exit(1)
print(f"DALI parts: {len(want)} of {len(want)} present, sha256 as in the manifest")
PY
}

# -- setup: wheels, headers, the native core, DALI ----------------------------------------------------------------
# whether fastload/_C for this Python loads, without importing fastload (whose own dependencies are checked apart)
native_loads() {
  "$PY" - <<'PY'
import importlib.machinery as m, importlib.util as u, pathlib, sys
so = next(pathlib.Path("fastload").glob("_C" + m.EXTENSION_SUFFIXES[0]), None)
if so is None:
    sys.exit(f"no fastload/_C{m.EXTENSION_SUFFIXES[0]} for this Python")
u.module_from_spec(u.spec_from_file_location("fastload._C", so))
PY
}

carried_debs() {
  # jpeglib.h / png.h (and their libraries) from the carried debs, where the machine lacks them; the later steps
  # get the same variables through $logs/setup.env (main sources it after this step)
  mkdir -p /tmp/jpeg && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/jpeg; done
  local lib=/tmp/jpeg/usr/lib/x86_64-linux-gnu
  export CPATH=/tmp/jpeg/usr/include:/tmp/jpeg/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH} LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  declare -p CPATH LIBRARY_PATH LD_LIBRARY_PATH | sed 's/^declare -x/export/' > "$logs/setup.env"
}

setup() {
  cd "$root" || return 1
  if [ -n "$dry" ]; then
    echo "dry run: nothing installed or built; checking what would be used"
    ls .gpu/whl/*.whl .gpu/debs/*.deb 2>/dev/null | sed 's/^/carried: /'
    [ -n "$(prebuilt)" ] && echo "carried: $(prebuilt)"
    native_loads && echo "fastload/_C loads for this Python" || return 1
    "$PY" -c "import fastload; print('fastload imports:', fastload.__file__)" || return 1
    return 0
  fi
  if ls .gpu/whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .gpu/whl/*.whl 2>&1 \
      | grep -v -i warn
  fi
  if ls .gpu/debs/*.deb >/dev/null 2>&1 && { ! echo '#include <jpeglib.h>' | g++ -E -x c++ - >/dev/null 2>&1 \
      || ! echo '#include <png.h>' | g++ -E -x c++ - >/dev/null 2>&1; }; then
    echo "jpeglib.h or png.h missing: using the carried debs"; carried_debs
  fi
  if [ -d .gpu/photo-wheels ]; then mkdir -p bench/data/wheels && cp -n .gpu/photo-wheels/*.whl bench/data/wheels/; fi
  if ! native_loads 2>/dev/null; then
    local s; s=$(date +%s)
    if "$PY" setup.py build_ext --inplace > "$logs/build.txt" 2>&1; then
      echo "built the native core in $(( $(date +%s) - s ))s"
    elif [ -n "$(prebuilt)" ]; then
      echo "BUILD FAILED after $(( $(date +%s) - s ))s (build.txt): using the prebuilt $(prebuilt)"
      cp "$(prebuilt)" fastload/ && carried_debs
    else
      echo "BUILD FAILED (build.txt) and no prebuilt _C for this Python in .gpu/prebuilt"; tail -n 5 "$logs/build.txt"
      return 1
    fi
  fi
  native_loads || return 1
  if [ -n "$dali" ] && [ ! -d "$SITE/nvidia/dali" ]; then
    dali_unpack || return 1
  fi
  "$PY" -c "import fastload; print('fastload imports:', fastload.__file__)" || return 1
  if [ -n "$dali" ]; then
    "$PY" -c "import nvidia.dali as d; print('DALI', d.__version__, d.__file__)" || { echo "DALI does not import"; return 1; }
  fi
}

# DALI's parts (checked in preflight) in the manifest's order, one xz stream into $SITE (Python's lzma and tarfile:
# the machine may lack xz)
dali_unpack() {
  local s n; s=$(date +%s)
  for n in $(grep -v '^#' "$root/.gpu/dali.manifest" | awk '{print $2}'); do cat "$DALI_PARTS/$n" || return 1; done \
    | "$PY" -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" "$SITE" \
    || { echo "DALI: unpacking failed"; return 1; }
  echo "DALI unpacked into $SITE in $(( $(date +%s) - s ))s"
}

env_report() {
  "$PY" - <<'PY'
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
  nvidia-smi 2>&1 || true
}

# the tests' verdicts per decoder: a failed test, or a required decoder (GPU_CHECK_REQUIRE) that did not run in full
verdicts_check() {
  local files=("$logs"/*.verdicts.jsonl)
  [ -e "${files[0]}" ] || { [ -z "$require" ] && return 0
                            echo "verdict: no test ran, and GPU_CHECK_REQUIRE names $require" >> "$logs/final.txt"; return 1; }
  "$PY" "$root/tests/cuda/gpu_verdicts.py" "${files[@]}" --require "$require" >/dev/null 2>&1 && return 0
  echo "verdict: a test failed, or a decoder of GPU_CHECK_REQUIRE=$require did not run in full (per decoder, above)" \
    >> "$logs/final.txt"
  return 1
}

# -- the dry run's own checks: what comes back, what travels, the budget ------------------------------------------
limits_check() {
  local bad=0 n total=0 mib
  n=$(find "$results" -maxdepth 1 -type f ! -name '*.tmp' | wc -l)
  echo "results: $n files (at most $MAX_FILES): $(cd "$results" && ls | tr '\n' ' ')"
  [ "$n" -le "$MAX_FILES" ] || { echo "LIMIT: $n result files, more than $MAX_FILES"; bad=1; }
  while read -r size name; do
    [ "$size" -le $(( MAX_FILE_MIB * 1048576 )) ] || { echo "LIMIT: $name is $size bytes, over ${MAX_FILE_MIB} MiB"; bad=1; }
  done < <(find "$results" -maxdepth 1 -type f -printf '%s %f\n')
  # what travels: tracked and untracked-not-ignored files, plus the carried .gpu/ (lease 1 and lease 2's last call)
  local tree gpu part
  tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
         | awk '{s += $1} END {print s + 0}')
  gpu=$(du -sb "$root/.gpu" 2>/dev/null | cut -f1); gpu=${gpu:-0}
  mib() { echo $(( ($1 + 1048575) / 1048576 )); }
  echo "travels: the working tree $(mib "$tree") MiB + .gpu/ $(mib "$gpu") MiB (at most ${MAX_TRAVEL_MIB} MiB a call)"
  [ $(( tree + gpu )) -le $(( MAX_TRAVEL_MIB * 1048576 )) ] || { echo "LIMIT: tree + .gpu/ over ${MAX_TRAVEL_MIB} MiB"; bad=1; }
  [ -d "$root/.gpu" ] || echo "note: no .gpu/ here (make gpu-prepare): its size is not checked"
  for part in "$root"/.gpu-dali/p*; do
    [ -d "$part" ] || continue
    mib=$(du -sb "$part" | cut -f1)
    echo "travels: the working tree + $(basename "$part") $(mib $(( tree + mib ))) MiB"
    [ $(( tree + mib )) -le $(( MAX_TRAVEL_MIB * 1048576 )) ] || { echo "LIMIT: tree + $(basename "$part") over ${MAX_TRAVEL_MIB} MiB"; bad=1; }
  done
  if [ -f "$root/.gpu/dali.manifest" ]; then
    dali_parts_check "$root/.gpu-dali" || bad=1  # the parts here, as gpu_prepare.sh made them
    last=$(ls -d "$root"/.gpu-dali/p* 2>/dev/null | tail -n 1)
    if [ -n "$last" ]; then
      mib=$(du -sb "$last" | cut -f1)
      if [ $(( tree + gpu + mib )) -le $(( MAX_TRAVEL_MIB * 1048576 )) ]; then
        echo "travels: the working tree + .gpu/ + $(basename "$last") $(mib $(( tree + gpu + mib ))) MiB: the last part can ride with lease 2's check call"
      else
        echo "travels: the last part does not fit beside .gpu/: lease 2 brings every part in a call of its own"
      fi
    fi
  fi
  for s in "${STEPS[@]}"; do total=$(( total + STEP_LIMITS[$s] )); done
  echo "time budget: $(for s in "${STEPS[@]}"; do printf '%s %ss, ' "$s" "${STEP_LIMITS[$s]}"; done)sum ${total}s" \
       "(budget ${budget}s; one device command at most 600s)"
  [ "$total" -le "$budget" ] && [ "$budget" -le 600 ] || { echo "LIMIT: the step limits (${total}s) exceed the budget"; bad=1; }
  return $bad
}

main() {
  while [ $# -gt 0 ]; do
    case $1 in
      --dry-run) dry=1 ;;
      --dali) dali=1 ;;
      -*) echo "gpu_check: unknown option $1" >&2; return 2 ;;
      *) results=$1 ;;
    esac
    shift
  done
  if [ -n "$dali" ]; then require=${GPU_CHECK_REQUIRE-dali,auto}; else require=${GPU_CHECK_REQUIRE-native,nvjpeg}; fi
  cd "$root" || return 1
  results=${results:-${OUT:-bench/results/gpu-check}}
  mkdir -p "$results" && results=$(cd "$results" && pwd)
  logs=$(mktemp -d /tmp/gpu-check-logs.XXXXXX)
  trap 'rm -rf "$logs"' EXIT  # everything in it is in logs.tar by then
  export root PY dry dali logs results require
  rm -f "$results/summary.txt" "$results/logs.tar" "$results/gpu_bench.md"
  trap on_signal TERM INT
  export PYTHONPATH="$SITE:$root:$root/tests/cuda${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  step preflight preflight || { log "preflight failed: nothing else run (reasons in preflight.txt, above)"
                                sed -n 's/^PRECONDITION: /  /p' "$logs/preflight.txt" | tee -a "$logs/steps.txt"
                                render; return 1; }
  step setup setup || { log "setup failed: no test run (setup.txt, build.txt)"; render; return 1; }
  # shellcheck disable=SC1091
  [ -f "$logs/setup.env" ] && source "$logs/setup.env"
  [ -z "$dry" ] && env_report > "$logs/env.txt" 2>&1 && sed -n 's/^device: /device: /p' "$logs/env.txt" > "$logs/device.txt"
  # shellcheck disable=SC2046  (lists of paths without spaces)
  step lag tests_step lag $(lag_files)
  # shellcheck disable=SC2046
  step sync tests_step sync $(sync_files)
  # shellcheck disable=SC2046
  step cuda tests_step cuda $(rest_files)
  step bench bench_step
  if [ -n "$dry" ]; then
    render  # summary.txt and logs.tar as they come back, counted and sized below
    limits_check > "$logs/limits.txt" 2>&1 || failed=1
    cat "$logs/limits.txt" >> "$logs/final.txt"
  fi
  [ -z "$dry" ] && { verdicts_check || failed=1; }
  echo "gpu-check: $([ "$failed" = 0 ] && echo PASSED || echo FAILED), $(( $(date +%s) - t0 ))s, results in $results" \
    | tee -a "$logs/final.txt"
  render
  [ -n "$dry" ] && cat "$logs/limits.txt"
  return "$failed"
}

if [ -z "${GPU_CHECK_SOURCED:-}" ]; then
  main "$@"
  exit $?
fi

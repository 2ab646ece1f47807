#!/usr/bin/env bash
# The whole test suite against the native core built with AddressSanitizer and UndefinedBehaviorSanitizer
# (`make sanitize`). The in-place build (fastload/_C*.so) is left alone: the package is copied to
# build/sanitize/pkg, the sanitized extension built into that copy, and the copy put first on PYTHONPATH.
#
# CPython itself is not instrumented, so the sanitizer runtimes are preloaded. Leak detection is off
# (detect_leaks=0): at exit CPython deliberately keeps interned objects, static types and module state,
# and the native pool deliberately leaks its state in forked children (csrc/pool.h); LeakSanitizer would
# report all of that. Leaks that matter here (threads, processes, descriptors, mappings, /dev/shm) are
# checked by tests/test_shutdown.py. Any ASan or UBSan report aborts the process and fails the run.
#
#   scripts/sanitize.sh                    # every test
#   scripts/sanitize.sh tests/native -x    # arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CXX=${CXX:-g++}
OUT=build/sanitize

rm -rf "$OUT/pkg"
mkdir -p "$OUT/pkg"
cp -r fastload "$OUT/pkg/"
rm -f "$OUT"/pkg/fastload/_C*.so
find "$OUT/pkg" -name __pycache__ -prune -exec rm -rf {} +
# -fno-sanitize-recover: a UBSan finding stops the process instead of printing and going on
FASTLOAD_SANITIZE=address,undefined CFLAGS="-fno-sanitize-recover=all" CXXFLAGS="-fno-sanitize-recover=all" \
    "$PY" setup.py -q build_ext --build-lib "$OUT/pkg" --build-temp "$OUT/tmp" >"$OUT/build.log" 2>&1 \
    || { cat "$OUT/build.log" >&2; exit 2; }

LIBASAN=$("$CXX" -print-file-name=libasan.so)
LIBUBSAN=$("$CXX" -print-file-name=libubsan.so)
for lib in "$LIBASAN" "$LIBUBSAN"; do
    [ -e "$lib" ] || { echo "sanitize: $lib not found (install the compiler's sanitizer runtimes)" >&2; exit 2; }
done
export LD_PRELOAD="$LIBASAN:$LIBUBSAN${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONPATH="$PWD/$OUT/pkg${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1  # `python -m pytest` would otherwise put the checkout (and its fastload/) first
export FASTLOAD_SANITIZER_RUN=1  # tests that measure memory (RSS) skip that part: ASan's allocator differs
# ASan intercepts dlopen, so libraries that find their siblings through their RUNPATH (DALI loading
# nvimgcodec) no longer do: put the wheel-bundled NVIDIA library directories on the search path.
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -d "$SITE/nvidia" ]; then
    NV=$(find "$SITE/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -)
    export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

"$PY" - <<'PY'
import os, fastload._C as C
path = os.path.realpath(C.__file__)
assert "/build/sanitize/" in path, f"not the sanitized build: {path}"
syms = open(path, "rb").read()
assert b"__asan_" in syms and b"__ubsan_" in syms, f"{path} is not instrumented"
print(f"sanitize: {path} (ASan + UBSan)")
PY
exec "$PY" -m pytest -q -p no:cacheprovider "${@:-tests}"

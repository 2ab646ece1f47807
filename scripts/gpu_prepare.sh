#!/usr/bin/env bash
# Here, before lending work to a GPU machine (no network there): fill the ignored folders that `make gpu-check`
# needs there and the machine lacks. docs/GPU.md gives the device calls that carry them.
#
#   scripts/gpu_prepare.sh [--dali]
#   scripts/gpu_prepare.sh --check-prune     check the DALI pruning below on PYTHON's DALI (default .venv's)
#
# .gpu/ (lease 1; carried whole, checked against the 64 MiB a call may carry by `gpu_check.sh --dry-run`):
#   (what the shared kit ../shared/gpu/prepare.sh makes, without its setup.sh: gpu_check.sh does the setup)
#   whl/        lmdb, xxhash, click, tqdm (declared dependencies), pybind11 >= 2.12 (the build's; preflight
#               accepts this wheel where the machine's pybind11 is older)
#   debs/       libjpeg62-turbo(-dev), libpng-dev, libpng16-16, zlib1g-dev: unpacked there when jpeglib.h or
#               png.h is missing
#   photo-wheels/  bench/photos.py's sources, if `make demo` fetched them (bench/data/wheels)
#   prebuilt/   _C for CPython 3.12 (the machines' Python), built here with a local python3.12
#               (GPU_PREBUILT_PYTHON, else pyenv's): gpu_check.sh uses it only when the build there fails; it
#               links the carried libjpeg62-turbo and libpng16 (LD_LIBRARY_PATH set by gpu_check.sh)
# --dali adds (lease 2):
#   .gpu-dali/pNN/partNN   DALI for CPython 3.12 as one xz tar split in parts of PART_MIB (default 56) MiB: with
#                          the ~4 MiB working tree, one part fits the 64 MiB a call carries; each part a call
#   .gpu/dali.manifest     "sha256 name" per part: gpu_check.sh --dali checks count and digests before unpacking
#   Only what fastload's JPEG path loads: DALI, nvimgcodec (its nvJPEG and libjpeg-turbo extensions), nvjpeg,
#   DALI's Python dependencies; dropped, with DALI still importing and decoding JPEG (checked on DALI 2.4.0 in
#   DALI's CPU mode here; the GPU decode is unchecked): nvcomp, nvjpeg2k, nvtiff, nvimgcodec's other
#   extensions and tools, headers, other Pythons' extension modules, DALI's framework plugins but PyTorch's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
PART_MIB=${PART_MIB:-56}
# The DALI verified here (pyproject's dali extra; tests/decoders/test_dali*.py run against it in CPU mode)
DALI_PINS=(nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43
           astunparse==1.6.3 gast==0.7.0 optree==0.20.0 nvtx==0.2.17 makefun==1.16.0 libcst==1.9.0)

# prune_dali SITE TAG: leave in SITE/nvidia only what fastload's JPEG path loads, extension modules of CPython TAG
prune_dali() {
  local site=$1 tag=$2
  rm -rf "$site"/nvidia/{libnvcomp,nvjpeg2k,nvtiff} "$site"/nvidia/dali/include "$site"/nvidia/nvimgcodec/{include,tools}
  find "$site/nvidia/nvimgcodec/extensions" -type f ! -name 'libnvjpeg_ext.so*' ! -name 'libjpeg_turbo_ext.so*' -delete
  find "$site" -name '*cpython-3*' ! -name "*cpython-${tag}-*" -delete
  rm -rf "$site"/nvidia/dali/plugin/{jax,numba,paddle.py,tf.py,triton.py} "$site"/nvidia/__init__.py
}

# --check-prune: the same pruning on a hard-linked copy of the DALI installed for PYTHON (default the project's
# .venv), which must still import and decode a JPEG in DALI's CPU mode and pass tests/decoders/test_dali.py
if [ "${1:-}" = "--check-prune" ]; then
  py=${PYTHON:-$root/.venv/bin/python}
  nv=$("$py" -c "import nvidia.dali, pathlib; print(pathlib.Path(nvidia.dali.__file__).parents[1])")
  tag=$("$py" -c "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp -al "$nv" "$tmp/nvidia"
  prune_dali "$tmp" "$tag"
  # a regular package here, so that the installed nvidia (whose __init__ extends its path) is not merged in
  echo "# pruned copy" > "$tmp/nvidia/__init__.py"
  echo "pruned: $(du -sh "$nv" | cut -f1) -> $(du -sh "$tmp/nvidia" | cut -f1)"
  PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" "$py" - <<'PY'
import io
import numpy as np
import nvidia, nvidia.dali as dali
from nvidia.dali import fn, pipeline_def, types
from PIL import Image
assert list(nvidia.__path__)[0].startswith("/tmp"), nvidia.__path__
buf = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(buf, "JPEG")
jpeg = np.frombuffer(buf.getvalue(), np.uint8)

@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def pipe():
    return fn.decoders.image(fn.external_source(source=lambda: [jpeg, jpeg], batch=True), device="cpu",
                             output_type=types.RGB)

p = pipe()
p.build()
out, = p.run()
assert np.array(out[0]).shape == (64, 80, 3)
print("pruned DALI", dali.__version__, "imports and decodes a JPEG (CPU mode) from", dali.__file__)
PY
  PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -q -p no:cacheprovider tests/decoders/test_dali.py
  exit $?
fi

PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
         -d "$1" "${@:2}" 2>&1 | grep -v '^WARNING: Location' || true; }
mkdir -p .gpu/whl .gpu/debs
dl .gpu/whl lmdb "xxhash>=3.0" "click>=8.1" "tqdm>=4.60" "pybind11>=2.12"
(cd .gpu/debs && apt-get download libjpeg62-turbo libjpeg62-turbo-dev libpng-dev libpng16-16 zlib1g-dev 2>&1 \
   | grep -v '^W:' || true)
# photos: bench/photos.py reads its sources from these wheels (`make demo` fetches them once)
if ls bench/data/wheels/*.whl >/dev/null 2>&1; then mkdir -p .gpu/photo-wheels && cp -n bench/data/wheels/*.whl .gpu/photo-wheels/; fi
for need in lmdb xxhash click tqdm pybind11; do
  ls .gpu/whl/"$need"-*.whl >/dev/null 2>&1 || { echo "gpu_prepare: no $need wheel in .gpu/whl" >&2; exit 1; }
done
for need in libpng-dev libpng16-16 zlib1g-dev libjpeg62-turbo; do
  ls .gpu/debs/"${need}"_*.deb >/dev/null 2>&1 || { echo "gpu_prepare: no $need .deb in .gpu/debs" >&2; exit 1; }
done

# -- the prebuilt _C for CPython 3.12 ---------------------------------------------------------------------------
py312=${GPU_PREBUILT_PYTHON:-$(ls /root/.pyenv/versions/3.12.*/bin/python3.12 "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 \
                                  2>/dev/null | head -n 1 || true)}
if [ -z "$py312" ] && command -v python3.12 >/dev/null; then py312=$(command -v python3.12); fi
if [ -n "$py312" ]; then
  tmp=$(mktemp -d)
  dl "$tmp/whl" "setuptools>=68"
  "$py312" -m pip install -q --no-index --no-deps --target "$tmp/site" "$tmp"/whl/*.whl .gpu/whl/pybind11-*.whl
  rm -rf .gpu/prebuilt && mkdir -p .gpu/prebuilt
  if PYTHONPATH="$tmp/site" "$py312" setup.py build_ext --build-lib "$tmp/lib" --build-temp "$tmp/build" > "$tmp/log" 2>&1; then
    cp "$tmp"/lib/fastload/_C.cpython-312-*.so .gpu/prebuilt/
    echo "prebuilt: $(ls .gpu/prebuilt)"
  else
    tail -n 20 "$tmp/log"; echo "gpu_prepare: the prebuilt _C for $py312 did not build" >&2; exit 1
  fi
  rm -rf "$tmp"
else
  echo "gpu_prepare: no python3.12 here (GPU_PREBUILT_PYTHON): no prebuilt _C; the machine must build" >&2
fi

# -- DALI ---------------------------------------------------------------------------------------------------------
if [ "${1:-}" = "--dali" ]; then
  tmp=$(mktemp -d)
  dl "$tmp/w" "${DALI_PINS[@]}"
  mkdir -p "$tmp/site"
  for w in "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
  prune_dali "$tmp/site" 312
  rm -rf .gpu-dali && mkdir -p .gpu-dali
  tar cf - -C "$tmp/site" . | xz -6 -T0 > "$tmp/dali.tar.xz"
  (cd .gpu-dali && split -b "${PART_MIB}m" -d "$tmp/dali.tar.xz" part \
     && for p in part*; do mkdir "p${p#part}" && mv "$p" "p${p#part}/"; done)
  (cd .gpu-dali && sha256sum p*/part* | sed 's#  p[0-9]*/#  #') > .gpu/dali.manifest
  sed -i "1i # DALI for CPython 3.12 ($(echo "${DALI_PINS[@]}")), $(wc -l < .gpu/dali.manifest) parts of <= ${PART_MIB} MiB: sha256 name" .gpu/dali.manifest
  rm -rf "$tmp"
  echo "DALI parts: $(ls -d .gpu-dali/p* | tr '\n' ' '); manifest .gpu/dali.manifest"
fi
du -sh .gpu .gpu/* .gpu-dali 2>/dev/null || true
echo "next: scripts/gpu_check.sh --dry-run checks what travels; docs/GPU.md gives the device calls"

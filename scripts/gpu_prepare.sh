#!/usr/bin/env bash
# Here, before lending work to a GPU machine: fill the ignored folder .gpu/ with what `make gpu-check` needs
# there and the machine lacks (no network there). The shared kit (../shared/gpu/prepare.sh: lmdb, libjpeg-turbo,
# the photo-source wheels, setup.sh; --dali for DALI's parts) carries what every project needs; this adds
# fastload's own:
#   .gpu/whl    xxhash, click, tqdm (declared dependencies: without xxhash fastload does not import; without
#               tqdm bench/photos.py cannot build real photos); .gpu/setup.sh installs every wheel there
#   .gpu/debs   libpng-dev, libpng16-16, zlib1g-dev (mask fields link libpng: without png.h the native core
#               does not build); scripts/gpu_check.sh unpacks them when png.h is missing
#
#   scripts/gpu_prepare.sh [--dali]       (GPU_KIT=DIR: the kit's folder, default ../shared/gpu)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
kit=${GPU_KIT:-$root/../shared/gpu}
[ -x "$kit/prepare.sh" ] || { echo "gpu_prepare: no GPU kit at $kit (set GPU_KIT)" >&2; exit 2; }
# The kit's exit status is not a verdict (its closing `du` of an absent .gpu-dali fails): what it must have
# made is checked instead.
"$kit/prepare.sh" "$@" || true
[ -f .gpu/setup.sh ] && ls .gpu/whl/lmdb-*.whl >/dev/null 2>&1 || { echo "gpu_prepare: the kit did not make .gpu/" >&2; exit 1; }
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d .gpu/whl "xxhash>=3.0" "click>=8.1" "tqdm>=4.60"
(cd .gpu/debs && apt-get download libpng-dev libpng16-16 zlib1g-dev)
for need in xxhash click tqdm; do
  ls .gpu/whl/"$need"-*.whl >/dev/null 2>&1 || { echo "gpu_prepare: no $need wheel in .gpu/whl" >&2; exit 1; }
done
for need in libpng-dev libpng16-16 zlib1g-dev; do
  ls .gpu/debs/"${need}"_*.deb >/dev/null 2>&1 || { echo "gpu_prepare: no $need .deb in .gpu/debs" >&2; exit 1; }
done
du -sh .gpu

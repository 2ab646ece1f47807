#!/usr/bin/env bash
# Build bench/.venvs/timm (git-ignored), where tests/augment/test_timm_real.py runs timm's own objects:
#
#   bash scripts/timm_test_venv.sh
#   bench/.venvs/timm/bin/python -m pytest tests/augment/test_timm_real.py tests/augment/test_torchvision_convert.py
#
# timm and torchvision from the package index need a CUDA torch for torchvision's C ops; their pure-Python parts
# (transforms, timm.data) work on the project's CPU torch once torchvision's fake-op registrations
# (torchvision/_meta_registrations.py, which register kernels for its C ops) are skipped. So this venv installs
# only timm and the torchvision that pairs with the project's torch, without dependencies, sees the project's
# .venv for everything else (torch, numpy, PIL, pytest) through a .pth line, and skips that one module with a
# second .pth line. Test-only: fastload never does this.
set -eu
cd "$(dirname "$0")/.."
MAIN=${MAIN_VENV:-.venv}
TIMM=${TIMM_VERSION:-1.0.31}
VENV=bench/.venvs/timm
main_site=$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base=$("$MAIN/bin/python" -c 'import sys; print(sys.base_prefix)')
torch_minor=$("$MAIN/bin/python" -c 'import torch; print(torch.__version__.split(".")[1])')
tv="torchvision==0.$((torch_minor + 15)).*"  # torchvision 0.(N+15) pairs with torch 2.N
"$base/bin/python3" -m venv "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(cd "$main_site" && pwd)" > "$site/fastload_main_venv.pth"
echo "import sys, types; sys.modules.setdefault('torchvision._meta_registrations', types.ModuleType('torchvision._meta_registrations'))" \
    > "$site/zz_skip_torchvision_fake_ops.pth"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "timm==$TIMM" "$tv"
"$VENV/bin/python" -c 'import timm, torchvision, torch; print("timm", timm.__version__, "torchvision", torchvision.__version__, "torch", torch.__version__)'

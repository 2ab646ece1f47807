#!/usr/bin/env bash
# Create the benchmark peers' virtual environments under bench/.venvs/ (gitignored) for bench/suite.py.
#
#   bash bench/setup_peers.sh [PEER ...]        default: every peer below
#
# Each peer lives in its own venv because they conflict: pillow-simd and plain pillow both install as
# `PIL`; FFCV pins numba/opencv and builds a C extension; DALI is ~300 MB of wheels. fastload itself runs
# in the project's .venv (make install). A peer that cannot be installed is skipped, not fatal: the reason
# goes to bench/.venvs/PEER.skip (printed here and by the suite), the pip/apt log to bench/.venvs/logs/.
# A venv whose recipe did not change since its last successful set-up is kept as it is.
#
# Peers:  torch-simd    torch DataLoader + torchvision transforms + pillow-simd
#         torch-pillow  torch DataLoader + torchvision transforms + plain pillow
#         dali          NVIDIA DALI (its CPU-only mode, device_id=None)
#         ffcv          FFCV 1.0.2 (built from source against Debian's libopencv-dev + libturbojpeg)
#         wds           WebDataset (tar shards) + torchvision transforms + pillow-simd
#         litdata       Lightning's LitData (optimize + StreamingDataset)
#         albumentations  torch DataLoader + albumentations (OpenCV decode and augmentations) for
#                       bench/augment_bench.py's row (bench/peers/albu_augment.py; not a suite peer)
#         plot          matplotlib for bench/plot.py (never installed into .venv: it pulls plain pillow)
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENVS=bench/.venvs
LOGS=$VENVS/logs
TORCH="torch==2.13.0"   # pip takes the CPU wheel from find-links (as the Makefile does)
ALBU="albumentations==2.0.8 opencv-python-headless==4.11.0.86"  # the last albumentations (MIT); AlbumentationsX continues it
ALL="torch-simd torch-pillow dali ffcv wds litdata albumentations plot"
mkdir -p "$LOGS"

say() { printf '[setup_peers] %s\n' "$*"; }

# The recipe of each peer: when it changes the venv is rebuilt.
recipe() {
    case "$1" in
        torch-simd)   echo "$TORCH torchvision numpy | pillow-simd" ;;
        torch-pillow) echo "$TORCH torchvision numpy pillow" ;;
        dali)         echo "$TORCH numpy nvidia-dali-cuda130" ;;
        ffcv)         echo "apt:libopencv-dev,libturbojpeg0-dev,pkg-config,g++ | $TORCH numpy pillow ffcv==1.0.2" ;;
        wds)          echo "$TORCH torchvision numpy webdataset | pillow-simd" ;;
        litdata)      echo "$TORCH numpy litdata" ;;
        albumentations) echo "$TORCH numpy | $ALBU" ;;
        plot)         echo "matplotlib" ;;
        *)            return 1 ;;
    esac
}

skip() {  # skip PEER REASON
    rm -rf "${VENVS:?}/$1"
    printf '%s\n' "$2" > "$VENVS/$1.skip"
    say "SKIP $1: $2"
}

pip_in() {  # pip_in PEER ARGS...: pip install into the peer's venv, logged
    "$VENVS/$1/bin/python" -m pip install -q --disable-pip-version-check "${@:2}" >> "$LOGS/$1.log" 2>&1
}

last_error() { grep -E "error|Error|ERROR" "$LOGS/$1.log" | grep -v "^WARNING: Location" | tail -n 2 | tr '\n' ' ' | cut -c1-300; }

swap_to_simd() {  # replace plain pillow by pillow-simd (same module name; install it last, as the Makefile does)
    "$VENVS/$1/bin/python" -m pip uninstall -q -y pillow pillow-simd >> "$LOGS/$1.log" 2>&1
    pip_in "$1" --no-deps --force-reinstall pillow-simd
}

apt_ensure() {  # apt_ensure PKG...: install the Debian packages that are missing (root only)
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "needs Debian packages ${missing[*]} (run as root or apt-get install them)" >&2
        return 1
    fi
    say "apt-get install ${missing[*]}"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
        >> "$LOGS/ffcv.log" 2>&1
}

install_peer() {
    local peer=$1
    case "$peer" in
        torch-simd)
            pip_in "$peer" "$TORCH" numpy || { skip "$peer" "pip could not install torch: $(last_error "$peer")"; return; }
            pip_in "$peer" "$TORCH" torchvision || say "$peer: no torchvision ($(last_error "$peer")); the runner uses its copy of torchvision's RandomResizedCrop"
            swap_to_simd "$peer" || { skip "$peer" "pillow-simd did not build: $(last_error "$peer")"; return; } ;;
        torch-pillow)
            pip_in "$peer" "$TORCH" numpy pillow || { skip "$peer" "pip could not install torch/pillow: $(last_error "$peer")"; return; }
            pip_in "$peer" "$TORCH" torchvision || say "$peer: no torchvision ($(last_error "$peer")); the runner uses its copy of torchvision's RandomResizedCrop" ;;
        dali)
            pip_in "$peer" "$TORCH" numpy nvidia-dali-cuda130 || { skip "$peer" "pip could not install nvidia-dali-cuda130: $(last_error "$peer")"; return; } ;;
        ffcv)
            apt_ensure libopencv-dev libturbojpeg0-dev pkg-config g++ 2>> "$LOGS/ffcv.log" \
                || { skip "$peer" "Debian packages libopencv-dev/libturbojpeg0-dev could not be installed: $(tail -n 1 "$LOGS/ffcv.log")"; return; }
            # pillow: ffcv imports PIL without declaring it
            pip_in "$peer" "$TORCH" numpy pillow || { skip "$peer" "pip could not install torch: $(last_error "$peer")"; return; }
            # FFCV 1.0.2 is an sdist: setup.py compiles libffcv against pkg-config's opencv4 and libturbojpeg;
            # it pulls numba, opencv-python, psutil, ... (cupy only for GPU normalisation, not used here).
            timeout 1200 "$VENVS/$peer/bin/python" -m pip install -q --disable-pip-version-check "$TORCH" ffcv==1.0.2 \
                >> "$LOGS/$peer.log" 2>&1 || { skip "$peer" "pip could not build ffcv==1.0.2 (20 min limit): $(last_error "$peer")"; return; } ;;
        wds)
            pip_in "$peer" "$TORCH" numpy webdataset || { skip "$peer" "pip could not install webdataset: $(last_error "$peer")"; return; }
            pip_in "$peer" "$TORCH" torchvision || say "$peer: no torchvision ($(last_error "$peer")); the runner uses its copy of torchvision's RandomResizedCrop"
            swap_to_simd "$peer" || { skip "$peer" "pillow-simd did not build: $(last_error "$peer")"; return; } ;;
        litdata)
            pip_in "$peer" "$TORCH" numpy litdata || { skip "$peer" "pip could not install litdata: $(last_error "$peer")"; return; } ;;
        albumentations)
            # torch first (the CPU wheel), then albumentations with the OpenCV it runs on, pinned
            pip_in "$peer" "$TORCH" numpy || { skip "$peer" "pip could not install torch: $(last_error "$peer")"; return; }
            pip_in "$peer" $ALBU || { skip "$peer" "pip could not install $ALBU: $(last_error "$peer")"; return; } ;;
        plot)
            pip_in "$peer" matplotlib || { skip "$peer" "pip could not install matplotlib: $(last_error "$peer")"; return; } ;;
    esac
    # The import check: a peer that installs but does not import is skipped too.
    local check
    if [ "$peer" = plot ]; then
        check=$("$VENVS/$peer/bin/python" -c "import matplotlib; print('matplotlib', matplotlib.__version__)" 2>&1)
    elif [ "$peer" = albumentations ]; then
        check=$("$VENVS/$peer/bin/python" bench/peers/albu_augment.py --check 2>&1)
    else
        check=$(PYTHONPATH=bench "$VENVS/$peer/bin/python" -m peers check "$peer" 2>&1)
    fi
    if [ $? -ne 0 ]; then
        skip "$peer" "installed but does not import: $(printf '%s' "$check" | tail -n 1 | cut -c1-300)"
        return
    fi
    recipe "$peer" > "$VENVS/$peer/.suite-recipe"
    say "ok   $peer: $(printf '%s' "$check" | tail -n 1)"
}

peers=${*:-$ALL}
for peer in $peers; do
    if ! recipe "$peer" >/dev/null; then say "unknown peer '$peer' (known: $ALL)"; exit 2; fi
    if [ -x "$VENVS/$peer/bin/python" ] && [ "$(cat "$VENVS/$peer/.suite-recipe" 2>/dev/null)" = "$(recipe "$peer")" ]; then
        say "ok   $peer: up to date ($VENVS/$peer)"
        continue
    fi
    say "setting up $peer (log: $LOGS/$peer.log)"
    rm -rf "${VENVS:?}/$peer" "$VENVS/$peer.skip"
    : > "$LOGS/$peer.log"
    if ! "$PYTHON" -m venv "$VENVS/$peer" >> "$LOGS/$peer.log" 2>&1; then
        skip "$peer" "could not create a venv with $PYTHON"
        continue
    fi
    "$VENVS/$peer/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >> "$LOGS/$peer.log" 2>&1
    install_peer "$peer"
done
exit 0

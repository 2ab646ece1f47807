#!/usr/bin/env bash
# The frameworks' own test suites as the bar for "drop-in" (issue 18): Lightning's and accelerate's tests about
# dataloaders, fetchers, loops, datamodules and batch-size scaling, run twice -- once with torch's DataLoader and
# once with torch.utils.data.DataLoader swapped for fastload.DataLoader in every process through a
# sitecustomize.py, the way a user swaps a loader in code they do not own. Run by hand, not in CI: it installs
# the pinned releases into its own venv and takes the test files from local clones, so no upstream file is ever
# copied into this repository.
#
#   scripts/upstream_suites.sh [options] LIGHTNING_CLONE ACCELERATE_CLONE
#
# Options:
#   --venv DIR             venv to build/reuse (default bench/.venvs/upstream; bench/.venvs/ is git-ignored)
#   --out FILE             results markdown (default bench/results/upstream_suites.md)
#   --work DIR             where the test files and junit XML go (default: a new temp folder, kept)
#   --lightning-ref REF    tag/commit of the Lightning clone to take tests from (default 2.6.5)
#   --accelerate-ref REF   tag/commit of the accelerate clone (default v1.15.0)
#   --torchdata CLONE      also run torchdata's test/stateful_dataloader tests (clone of pytorch/data)
#   --torchdata-ref REF    its tag/commit (default v0.11.0)
#   --fastload-src DIR     fastload tree (with its built _C*.so) put first on PYTHONPATH for the fastload run,
#                          e.g. another worktree; default: the editable install of this repository
#   --extra-site FILE      Python appended to the fastload run's sitecustomize.py after the swap: an experiment
#                          (e.g. a known cause patched by hand, to see what lies behind it); the table says so
#   --fastload-label TEXT  how the table names that tree (e.g. "branch dropin @ 6ffed09" for an exported snapshot)
#   --runs LIST            comma list of runs, of "torch" and "fastload" (default torch,fastload)
#   --baseline DIR         junit folder of an earlier torch run to compare against (with --runs fastload)
#   --timeout S            per-test timeout (default 180)
#   --files PATTERN        only the listed test files whose path contains PATTERN (for a quick look)
#   --skip-install         reuse the venv as it is
set -euo pipefail

# All of it in one function, called on the last line: bash then reads the whole file before running any of it,
# so editing the script during a (long) run cannot change the run.
main() {
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=$REPO/bench/.venvs/upstream
OUT=$REPO/bench/results/upstream_suites.md
WORK=""
L_REF=2.6.5
A_REF=v1.15.0
TD_CLONE=""
TD_REF=v0.11.0
FL_SRC=""
EXTRA_SITE=""
FL_LABEL=""
RUNS=torch,fastload
BASELINE=""
TIMEOUT=180
ONLY=""
SKIP_INSTALL=0
ARGS=("$@")
POS=()

die() { echo "upstream_suites: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --venv) VENV=$(realpath -m "$2"); shift 2 ;;
        --out) OUT=$(realpath -m "$2"); shift 2 ;;
        --work) WORK=$(realpath -m "$2"); shift 2 ;;
        --lightning-ref) L_REF=$2; shift 2 ;;
        --accelerate-ref) A_REF=$2; shift 2 ;;
        --torchdata) TD_CLONE=$(realpath "$2"); shift 2 ;;
        --torchdata-ref) TD_REF=$2; shift 2 ;;
        --fastload-src) FL_SRC=$(realpath "$2"); shift 2 ;;
        --fastload-label) FL_LABEL=$2; shift 2 ;;
        --extra-site) EXTRA_SITE=$(realpath "$2"); shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --baseline) BASELINE=$(realpath "$2"); shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --files) ONLY=$2; shift 2 ;;
        --skip-install) SKIP_INSTALL=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) POS+=("$1"); shift ;;
    esac
done
[ ${#POS[@]} -eq 2 ] || die "expected two arguments, LIGHTNING_CLONE ACCELERATE_CLONE (see --help), got ${#POS[@]}"
L_CLONE=$(realpath "${POS[0]}"); A_CLONE=$(realpath "${POS[1]}")
has_ref() {  # has_ref CLONE REF OPTION
    git -C "$1" rev-parse -q --verify "$2^{commit}" >/dev/null \
        || die "$1 has no commit or tag '$2' (git -C $1 tag lists its tags); name one that it has with $3"
}
has_ref "$L_CLONE" "$L_REF" --lightning-ref
has_ref "$A_CLONE" "$A_REF" --accelerate-ref
[ -z "$TD_CLONE" ] || has_ref "$TD_CLONE" "$TD_REF" --torchdata-ref

# The machine is shared: everything below runs at the lowest priority.
NICE=(nice -n 19)

# Which test files. ~20 files whose subject is the data path: loaders, fetchers, loops, datamodules, batch-size
# scaling, combined loaders, Fabric's loader wrappers; accelerate's loader shards, checkpointed loader state and
# the CPU launcher. Paths are relative to each clone's root.
LIGHTNING_FILES=(
    tests/tests_pytorch/trainer/test_dataloaders.py
    tests/tests_pytorch/trainer/connectors/test_data_connector.py
    tests/tests_pytorch/trainer/dynamic_args/test_multiple_eval_dataloaders.py
    tests/tests_pytorch/loops/test_fetchers.py
    tests/tests_pytorch/loops/test_loops.py
    tests/tests_pytorch/loops/test_evaluation_loop.py
    tests/tests_pytorch/loops/test_prediction_loop.py
    tests/tests_pytorch/loops/test_training_epoch_loop.py
    tests/tests_pytorch/loops/test_training_loop.py
    tests/tests_pytorch/loops/test_double_iter_in_iterable_dataset.py
    tests/tests_pytorch/core/test_datamodules.py
    tests/tests_pytorch/tuner/test_scale_batch_size.py
    tests/tests_pytorch/utilities/test_combined_loader.py
    tests/tests_pytorch/utilities/test_data.py
    tests/tests_fabric/utilities/test_data.py
    tests/tests_fabric/test_wrappers.py
)
ACCELERATE_FILES=(
    tests/test_data_loader.py
    tests/test_state_checkpointing.py
    tests/test_accelerator.py
    tests/test_cpu.py
)
TORCHDATA_FILES=(
    test/stateful_dataloader/test_dataloader.py
    test/stateful_dataloader/test_state_dict.py
    test/stateful_dataloader/test_sampler.py
    test/stateful_dataloader/test_incremental_state.py
)

# ---------------------------------------------------------------- venv
PY=$VENV/bin/python
pipi() {  # quiet, less the find-links/extra-index notes this machine's pip.conf makes pip print per package
    "${NICE[@]}" "$PY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file" >&2)
}
if [ $SKIP_INSTALL -eq 0 ]; then
    echo "== venv $VENV"
    test -x "$PY" || python3 -m venv "$VENV"
    # torch first and exact: any looser spec makes pip fetch a multi-GB CUDA build instead of the CPU wheel on disk.
    pipi torch==2.13.0
    pipi "setuptools>=77" wheel "pybind11>=2.12"
    pipi pillow-simd  # fastload names no PIL (it takes the environment's); this venv's is pillow-simd, as .venv's
    pipi -e "$REPO" --no-build-isolation
    # The releases under test, and what the chosen test files import (requirements/{pytorch,fabric}/test.txt at
    # 2.6.5 and accelerate's test_prod extra, less what these files never import: coverage, onnx, pandas,
    # tensorboard, transformers, datasets, scikit-learn -- the few tests that need those skip). expecttest:
    # torch.testing._internal, which torchdata's StatefulDataLoader tests import.
    pipi torch==2.13.0 lightning==2.6.5 "accelerate==1.15.*" "torchdata>=0.11" \
        pytest==9.0.2 pytest-timeout==2.4.0 pytest-rerunfailures==16.1 "cloudpickle>=1.3,<3.2" psutil \
        parameterized pytest-subtests expecttest
    # pillow-simd last, after anything that might have pulled plain pillow, as the Makefile does.
    if "$PY" -m pip show -q pillow >/dev/null 2>&1; then
        "$PY" -m pip uninstall -q -y pillow pillow-simd
        pipi --no-deps --force-reinstall pillow-simd
    fi
fi
"$PY" - <<'EOF'
import importlib.metadata as md, sys
torch = md.version("torch")
pil = [d.metadata["Name"].lower() for d in md.distributions()
       if d.metadata["Name"].lower() in ("pillow", "pillow-simd")]
if not torch.startswith("2.13.0") or pil != ["pillow-simd"]:
    sys.exit(f"upstream_suites: venv has torch {torch} and PIL from {pil}; expected torch 2.13.0 and pillow-simd only")
print("venv: torch", torch, "| PIL from", pil[0], "| lightning", md.version("lightning"),
      "| accelerate", md.version("accelerate"), "| torchdata", md.version("torchdata"))
EOF

# ---------------------------------------------------------------- test files at the tags
if [ -z "$WORK" ]; then WORK=$(mktemp -d /tmp/upstream_suites.XXXXXX); fi
mkdir -p "$WORK"
echo "== work folder $WORK"
take() {  # take CLONE REF DEST PATH...: the named paths of CLONE at REF, as files under DEST
    local clone=$1 ref=$2 dest=$3; shift 3
    rm -rf "$dest"; mkdir -p "$dest"
    # (a partial mirror's missing blobs outside the named paths make git print "invalid object"; harmless)
    git -C "$clone" archive --format=tar "$ref" -- "$@" 2> >(grep -v "^error: invalid object" >&2) | tar -x -C "$dest"
}
take "$L_CLONE" "$L_REF" "$WORK/src/lightning" tests/tests_pytorch tests/tests_fabric pyproject.toml
take "$A_CLONE" "$A_REF" "$WORK/src/accelerate" tests pyproject.toml
SUITES="lightning accelerate"
if [ -n "$TD_CLONE" ]; then
    take "$TD_CLONE" "$TD_REF" "$WORK/src/torchdata" test pyproject.toml
    SUITES="$SUITES torchdata"
fi

# sitecustomize.py runs in every Python process started with it on PYTHONPATH: pytest, `python -c` children,
# multiprocessing spawn/forkserver children (they inherit the environment), `accelerate launch`, torchrun.
SWAP=$WORK/swap
mkdir -p "$SWAP"
cat > "$SWAP/sitecustomize.py" <<'EOF'
# Written by fastload's scripts/upstream_suites.sh: replace torch's DataLoader by fastload's everywhere, before any
# framework module does `from torch.utils.data import DataLoader`.
import torch.utils.data
import torch.utils.data.dataloader

import fastload

torch.utils.data.DataLoader = fastload.DataLoader
torch.utils.data.dataloader.DataLoader = fastload.DataLoader
EOF
if [ -n "$EXTRA_SITE" ]; then
    printf '\n# --extra-site %s\n' "$EXTRA_SITE" >>"$SWAP/sitecustomize.py"
    cat "$EXTRA_SITE" >>"$SWAP/sitecustomize.py"
fi

# ---------------------------------------------------------------- runs
run_suite() {  # run_suite RUN SUITE: every file of SUITE, one pytest process per file, junit + wall time per file
    local run=$1 suite=$2 files dir
    case $suite in
        lightning) files=("${LIGHTNING_FILES[@]}") ;;
        accelerate) files=("${ACCELERATE_FILES[@]}") ;;
        torchdata) files=("${TORCHDATA_FILES[@]}") ;;
    esac
    for f in "${files[@]}"; do
        [ -z "$ONLY" ] || [[ $f == *"$ONLY"* ]] || continue
        local src=$WORK/src/$suite
        [ -f "$src/$f" ] || { echo "   missing $suite/$f at its ref" >&2; continue; }
        # Run from the file's own test root, as the projects' CI does (Lightning: tests/tests_pytorch), so
        # `import tests_pytorch...` and the conftests resolve; pyproject.toml above it gives their pytest config.
        case $f in
            tests/tests_pytorch/*|tests/tests_fabric/*) dir=$src/$(echo "$f" | cut -d/ -f1-2) ;;
            *) dir=$src ;;
        esac
        local rel=${f#"${dir#"$src"/}/"}
        [ "$dir" != "$src" ] || rel=$f
        local xml=$WORK/junit/$run/$suite/$(echo "$f" | tr / _).xml
        mkdir -p "$(dirname "$xml")"
        local t0=$SECONDS rc=0
        (cd "$dir" && env $ENVSET "${NICE[@]}" "$PY" -m pytest "$rel" -q -p no:cacheprovider \
            --timeout="$TIMEOUT" --junitxml="$xml" -o junit_family=xunit1 --tb=line -rN --color=no \
            >"${xml%.xml}.log" 2>&1) || rc=$?
        printf '%s\t%s\t%s\t%s\t%s\n' "$run" "$suite" "$f" "$((SECONDS - t0))" "$rc" >>"$WORK/junit/times.tsv"
        printf '   %-9s %-10s %-66s %4ss rc=%s  %s\n' "$run" "$suite" "$f" "$((SECONDS - t0))" "$rc" \
            "$(grep -aE '[0-9]+ (passed|failed|skipped|errors?)|no tests ran' "${xml%.xml}.log" | tail -n 1)"
    done
}

check_swap() {  # the swap must be in effect in the fastload run and absent in the torch run, or the table lies
    env $ENVSET "$PY" -c "
import sys, torch.utils.data as d, torch.utils.data.dataloader as dl
swapped = d.DataLoader.__module__.startswith('fastload') and dl.DataLoader is d.DataLoader
if swapped != ($1):
    sys.exit('upstream_suites: DataLoader is %s.%s in the $2 run' % (d.DataLoader.__module__, d.DataLoader.__name__))
if swapped:
    import fastload; print('   fastload from', fastload.__file__)
"
}

mkdir -p "$WORK/junit"
for run in ${RUNS//,/ }; do
    case $run in
        torch) ENVSET="PYTHONPATH=" ; check_swap False torch ;;
        fastload) ENVSET="PYTHONPATH=$SWAP${FL_SRC:+:$FL_SRC}"; check_swap True fastload ;;
        *) die "--runs takes torch and/or fastload, got '$run'" ;;
    esac
    echo "== run $run"
    rm -rf "$WORK/junit/$run"
    for suite in $SUITES; do run_suite "$run" "$suite"; done
done

# ---------------------------------------------------------------- table
refs=(--ref "Lightning $L_REF = $(git -C "$L_CLONE" rev-parse --short "$L_REF^{commit}")"
      --ref "accelerate $A_REF = $(git -C "$A_CLONE" rev-parse --short "$A_REF^{commit}")")
if [ -n "$TD_CLONE" ]; then
    refs+=(--ref "torchdata $TD_REF = $(git -C "$TD_CLONE" rev-parse --short "$TD_REF^{commit}")")
fi
fl_commit=$(git -C "${FL_SRC:-$REPO}" log -1 --format=%h -- fastload csrc 2>/dev/null || true)
fl_commit=${fl_commit:+"HEAD $(git -C "${FL_SRC:-$REPO}" rev-parse --short HEAD), last change to fastload/ and csrc/ in $fl_commit"}
fl_dirty=$(git -C "${FL_SRC:-$REPO}" status --porcelain --untracked-files=no -- fastload csrc 2>/dev/null | head -c1 || true)
"$PY" "$REPO/scripts/upstream_suites_report.py" --junit "$WORK/junit" ${BASELINE:+--baseline "$BASELINE"} \
    --out "$OUT" --command "scripts/upstream_suites.sh $(printf '%q ' "${ARGS[@]}")" \
    --fastload "${FL_LABEL:-${FL_SRC:-$REPO}}${fl_commit:+, $fl_commit}${fl_dirty:+ (with uncommitted changes)}${EXTRA_SITE:+; sitecustomize extended by $EXTRA_SITE}" \
    "${refs[@]}" --venv "$VENV"
echo "== results in $OUT (junit XML and logs in $WORK/junit)"
}

main "$@"; exit $?  # on the same line: bash must not read on from a file edited during the run

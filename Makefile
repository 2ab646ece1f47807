# Two commands matter: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fastload-installed

.PHONY: install demo test wheel lint docs sanitize fuzz soak bench clean gpu-check gpu-dry-run gpu-prepare

install: $(STAMP)

# torch==2.13.0 first: pip takes the CPU wheel on disk (find-links) instead of the CUDA build.
# fastload depends on no PIL by name (it takes the environment's); this venv gets pillow-simd, faster than
# plain pillow for the torch DataLoader baseline of the benchmarks. Checked again last, after anything that
# might have pulled plain pillow (both install as `PIL`), so `import PIL` is pillow-simd.
# The dali extra (~270 MB) is installed so that `make test` runs the DALI path in its CPU-only mode.
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cc csrc/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q "setuptools>=77" wheel "pybind11>=2.12"
	$(BIN)/python -m pip install -q pillow-simd
	$(BIN)/python -m pip uninstall -q -y fastload 2>/dev/null || true  # a venv from before the rename to torch-fastload
	$(BIN)/python -m pip install -q -e ".[test,dali]" --no-build-isolation
	@if $(BIN)/python -m pip show -q pillow >/dev/null 2>&1; then \
	    $(BIN)/python -m pip uninstall -q -y pillow pillow-simd; \
	    $(BIN)/python -m pip install -q --no-deps --force-reinstall pillow-simd; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python bench/demo.py --out demo_out

test: $(STAMP) lint docs
	$(BIN)/python -m pytest -q tests

# An extra's tools without reinstalling fastload itself (scripts/extra_requirements.py says why).
$(VENV)/.extra-%: pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q $$($(BIN)/python scripts/extra_requirements.py $*)
	touch $@

# ruff check, ruff format --check and mypy, configured in pyproject.toml; pre-commit runs the same tools
# (.pre-commit-config.yaml).
lint: $(VENV)/.extra-lint
	$(BIN)/ruff check fastload examples scripts setup.py
	$(BIN)/ruff format --check fastload examples scripts setup.py
	$(BIN)/mypy

# The documentation site into site/, warnings as errors (mkdocs.yml); tests/test_docs.py runs its code blocks.
docs: $(VENV)/.extra-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# dist/: the sdist and a manylinux wheel (libjpeg-turbo and libpng bundled by auditwheel; no torch symbols, so
# one wheel per Python serves every torch >= 2.1). `pip install dist/torch_fastload-*.whl` needs no compiler.
wheel: $(STAMP)
	PYTHON=$(BIN)/python scripts/wheel.sh dist

# The whole test suite against the native core built with ASan + UBSan (see scripts/sanitize.sh).
sanitize: $(STAMP)
	PYTHON=$(BIN)/python scripts/sanitize.sh

# 1,000,000 fuzz inputs over every target, one job per core (tests/fuzz/run.py; a short run is part of `make test`).
fuzz: $(STAMP)
	$(BIN)/python tests/fuzz/run.py --target each --jobs $$(nproc)

# 50 epochs on every loader path; fails if RSS, the process tree's PSS, descriptors, threads or /dev/shm drift after epoch 1.
soak: $(STAMP)
	$(BIN)/python bench/soak.py --epochs 50

# Every benchmark against the peers, each peer in its own virtualenv (bench/.venvs), results in bench/results.
bench: $(STAMP)
	PYTHON=$(BIN)/python bench/setup_peers.sh
	$(BIN)/python bench/suite.py

# On a GPU machine (no venv: the machine's CUDA torch; what it lacks comes from .gpu/): the lag/trap/switch/sync
# checks, the rest of tests/cuda and bench/gpu_bench.py --quick, in one call of 420 s at most, results in $OUT
# (summary.txt, logs.tar, gpu_bench.md). docs/GPU.md gives the device calls. GPU_CHECK_ARGS=--dali: lease 2 (DALI);
# GPU_CHECK_STEPS=lag,sync: only these steps; GPU_CHECK_REQUIRE=dali,nvjpeg: decoders that must run in full.
gpu-check:
	scripts/gpu_check.sh $(GPU_CHECK_ARGS) $(GPU_CHECK_OUT)

# Here, without CUDA: every step's setup and collection, the results and what travels against the device's limits,
# and the time budget (tests/test_gpu_check_script.py runs it in CI).
gpu-dry-run: $(STAMP)
	PYTHON=$(BIN)/python scripts/gpu_check.sh --dry-run $(if $(GPU_CHECK_OUT),$(GPU_CHECK_OUT),/tmp/gpu-check-dry-run)

# Here, before a GPU run: .gpu/ (ignored) gets what the lent machine lacks (wheels, debs, a prebuilt _C for
# CPython 3.12); DALI=1 adds DALI's parts (.gpu-dali/pNN, .gpu/dali.manifest). Needs the package index and Debian's
# mirror.
gpu-prepare:
	scripts/gpu_prepare.sh $(if $(DALI),--dali)

clean:
	rm -rf build dist *.egg-info fastload/_C*.so demo_out site

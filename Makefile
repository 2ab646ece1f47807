# Two commands matter: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fastload-installed

.PHONY: install demo test clean

install: $(STAMP)

# torch==2.13.0 first: pip takes the CPU wheel on disk (find-links) instead of the CUDA build.
# pillow-simd last, after anything that might pull plain pillow, so `import PIL` is pillow-simd.
# The dali extra (~270 MB) is installed so that `make test` runs the DALI path in its CPU-only mode.
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cc csrc/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q "setuptools>=68" wheel "pybind11>=2.12"
	$(BIN)/python -m pip install -q -e ".[test,dali]" --no-build-isolation
	@if $(BIN)/python -m pip show -q pillow >/dev/null 2>&1; then \
	    $(BIN)/python -m pip uninstall -q -y pillow pillow-simd; \
	    $(BIN)/python -m pip install -q --no-deps --force-reinstall pillow-simd; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python bench/demo.py --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf build *.egg-info fastload/_C*.so demo_out

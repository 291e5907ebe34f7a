# mgcaffe: every target creates and uses its own virtual environment in .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all venv demo test test-fast lint proto bench gpu-check gpu-check-double gpu-wheels clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,mpich]'
	touch $(STAMP)

venv: $(STAMP)

## demo: the main job on built-in defaults
demo: $(STAMP)
	$(BIN)/python tools/demo.py

## test: lint, then the whole test suite (what CI runs)
test: $(STAMP) lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## test-fast: the quick loop; skips tests marked slow
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check mgcaffe tests tools benchmarks

## proto: regenerate mgcaffe/proto/caffe_pb2.py from proto/caffe.proto
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=mgcaffe/proto proto/caffe.proto

## gpu-check: the GPU acceptance run (docs/gpu.md) with the Python that has CuPy: .venv's
## when there is one, else python3 (or GPU_PYTHON=...). Needs no network: wheels that
## `make gpu-wheels` put in gpu-wheels/ beforehand are installed into .gpu-site/ first.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_WHEELS := gpu-wheels
GPU_SITE   := .gpu-site
gpu-check:
	@if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -m pip install -q --no-index --no-deps --upgrade --target $(GPU_SITE) \
	    $(GPU_WHEELS)/*.whl; fi
	PYTHONPATH=$(if $(wildcard $(GPU_WHEELS)/*.whl),$(CURDIR)/$(GPU_SITE):)$(CURDIR) \
	  $(GPU_PYTHON) tools/gpu_check.py --out gpu-check-results.json

## gpu-check-double: the same script on the CuPy test double (tests/support/cupy_double), with
## tiny sizes (--small): every section must end `ok`, or `skipped` for a reason a GPU
## machine shares; timings mean nothing here. A test runs it (tests/gpu/test_gpu_check_double.py).
GPU_CHECK_DOUBLE_OUT ?= gpu-check-double.json
gpu-check-double: $(STAMP)
	PYTHONPATH=$(CURDIR)/tests/support$(if $(PYTHONPATH),:$(PYTHONPATH)) \
	  $(BIN)/python -m cupy_double tools/gpu_check.py --small --out $(GPU_CHECK_DOUBLE_OUT)

## gpu-wheels: on a machine with network, download what `make gpu-check` needs beyond
## Python, numpy and CuPy (protobuf for caffe_pb2.py; pure-Python wheel, any platform)
gpu-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --platform any \
	  --implementation py --python-version 3 -d $(GPU_WHEELS) 'protobuf>=7.35.1'

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-output $(GPU_SITE) gpu-check-double.json

# mgcaffe: every target creates and uses its own virtual environment in .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all venv demo test test-fast lint proto bench gpu-check clean

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

## gpu-check: the GPU acceptance run (docs/gpu.md); on a GPU machine whose own Python has
## CuPy: `make gpu-check GPU_PYTHON=python3`
GPU_PYTHON ?= $(BIN)/python
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --out gpu-check-results.json

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-output

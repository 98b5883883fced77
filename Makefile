# The two commands of the README: `make demo` and `make test`. Both set up what is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[engine,dse,test]'
	$(BIN)/pip install -q --no-deps 'pnnx==20261020'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(DEMO)
	$(BIN)/autodice zoo resnet50 -o $(DEMO)/resnet50.onnx
	$(BIN)/autodice split $(DEMO)/resnet50.onnx -m specs/resnet50/mapping.json \
	    -p specs/resnet50/platform.txt -o $(DEMO)/out --check
	$(BIN)/autodice view $(DEMO)/out -o $(DEMO)/partition.png

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/split_bench.py

clean:
	rm -rf build

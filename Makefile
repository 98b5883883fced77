# The two commands of the README: `make demo` and `make test`. Both set up what is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: demo test bench clean test-tools fidelity

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[engine,dse,test]'
	$(BIN)/pip install -q --no-deps 'pnnx==20261020'
	# trained PP-OCR models for the tests (tests/test_trained_ocr.py): only its .onnx files
	$(BIN)/pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	touch $(STAMP)

# The main job on the bundled default: SqueezeNet (full size, seeded weights) over 2 ranks.
# The first run also builds ncnn once (~6 min on 2 cores; cached in ~/.cache/autodice); the
# tests use the same build.
demo: $(STAMP)
	mkdir -p $(DEMO)
	$(BIN)/autodice zoo squeezenet -o $(DEMO)/squeezenet.onnx
	$(BIN)/python -c "import numpy as np; np.save('$(DEMO)/input.npy', \
	    np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))"
	$(BIN)/autodice split $(DEMO)/squeezenet.onnx -m specs/squeezenet/mapping.json \
	    -p specs/squeezenet/platform.txt -o $(DEMO)/out --check
	$(BIN)/autodice gen $(DEMO)/out
	$(BIN)/autodice build $(DEMO)/out
	$(BIN)/autodice run $(DEMO)/out --input $(DEMO)/input.npy --frames 50 --check
	$(BIN)/autodice view $(DEMO)/out -o $(DEMO)/report.html

# What the tests run besides Python: sshd and rsync (an emulated cluster, tests/test_cluster.py),
# a Vulkan device for GPU ranks (Mesa's lavapipe: Vulkan on the CPU), for an emulated aarch64
# board qemu-user and the aarch64 cross compiler (tests/test_arm.py), and a browser to load the
# report page in (Debian's chromium, headless: tests/test_report.py). As root, install what is
# missing from Debian; otherwise those tests skip and say why.
test-tools:
	@missing=; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing="$$missing mesa-vulkan-drivers"; \
	ldconfig -p | grep -q libvulkan.so.1 || missing="$$missing libvulkan1"; \
	[ -x /usr/bin/qemu-aarch64-static ] || missing="$$missing qemu-user-static"; \
	command -v aarch64-linux-gnu-g++ >/dev/null || missing="$$missing g++-aarch64-linux-gnu"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "note:$$missing missing (not root): the tests that need them skip"; fi; \
	fi

# Three pytest-xdist workers on the two cores (the tests wait on jobs as much as they compute),
# then the tests marked `alone` (timed against the wall clock, or on the emulated cluster) one
# at a time with nothing beside them. Both parts run; either failing fails.
test: $(STAMP) test-tools
	$(BIN)/python -m pytest -q -n 3 -m "not slow and not alone"; code=$$?; \
	$(BIN)/python -m pytest -q -p no:xdist -m "alone and not slow" && exit $$code

# Every benchmark; each prints a table and writes build/bench/<name>.json, then goals.py prints
# every goal with the figure measured and ✔/✘. The deploy, cost-model, recovery, boards and ARM
# ones need root (an emulated cluster); they are skipped with a note otherwise.
bench: $(STAMP) test-tools
	$(BIN)/python bench/split_bench.py
	$(BIN)/python bench/backend_bench.py
	$(BIN)/python bench/dse_bench.py
	$(BIN)/python bench/parallel_bench.py
	$(BIN)/python bench/session_bench.py
	$(BIN)/python bench/detect_bench.py
	$(BIN)/python bench/video_bench.py
	$(BIN)/python bench/int8_bench.py
	$(BIN)/python bench/report_bench.py
	$(BIN)/python bench/metrics_bench.py
	$(BIN)/python bench/check_bench.py
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/python bench/deploy_bench.py \
	  && $(BIN)/python bench/wire_bench.py \
	  && $(BIN)/python bench/costmodel_bench.py && $(BIN)/python bench/recovery_bench.py \
	  && $(BIN)/python bench/boards_bench.py && $(BIN)/python bench/arm_bench.py --ncnn; \
	else echo "note: deploy_bench.py, wire_bench.py, costmodel_bench.py, recovery_bench.py," \
	  "boards_bench.py, arm_bench.py need root (emulated cluster): skipped"; fi
	$(BIN)/python bench/goals.py

# ONNX's node conformance cases for CNN operators (tests/test_conformance.py, marked slow, no
# torch: counts per operator into build/conformance.json), then the fidelity suite
# (tests/test_fidelity.py, marked slow) once per torch release: the pinned
# one and the two before it, each in its own venv under ~/.cache/autodice/torch (torch,
# torchvision, timm and ultralytics from the package index: 1-6 GB each, and pip adds what
# a venv lacks; PIP_CONSTRAINT=/dev/null, as a machine's own pip constraint may cap torch below
# the pinned release). FIDELITY passes options to that pytest, e.g. FIDELITY="-k swin_t".
TORCH_RELEASES := 2.15.0:0.29.2 2.14.1:0.29.1 2.13.0:0.28.0
TORCH_HOME_DIR := $(HOME)/.cache/autodice/torch
fidelity: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests/test_conformance.py
	@for r in $(TORCH_RELEASES); do t=$${r%%:*}; v=$${r##*:}; d=$(TORCH_HOME_DIR)/$$t; \
	  { [ -x $$d/bin/python ] || $(PY) -m venv $$d; } && PIP_CONSTRAINT=/dev/null $$d/bin/pip \
	    install -q "torch==$$t" "torchvision==$$v" "onnxscript>=0.5,<0.8" onnx "timm==1.0.31" \
	    "ultralytics==8.4.190" || exit 1; \
	  echo "== torch $$t"; AUTODICE_TORCH_PYTHON=$$d/bin/python $(BIN)/python -m pytest -q \
	    -m slow tests/test_fidelity.py $(FIDELITY) || exit 1; done

clean:
	rm -rf build

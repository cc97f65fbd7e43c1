#!/usr/bin/env bash
# `dsv4patch status --installed` on the H200, against the two vLLM 0.26.0 sites
# device.sh builds (stock: vLLM's own wheel; patched: the patched .py files and
# the kernel plugin wheel).  Only a GPU machine runs the command's last step,
# `python -m <kernel package> check` ("kernels active"); everything else it
# does is tested on CPU in CI (tests/test_vllm_wheel.py).
#
# Needs: a call of device.sh earlier on this machine (the sites), and
# .e2e/status from tests/gpu/e2e/pack_status.py carried in this call (the
# 0.26.0 sdist blob and dsv4patch's pure-Python dependencies).  The cache is a
# fresh one under $E2E: the tree is made from the verified sdist with the
# machine's git.  Expected: patched exit 0 (every patch present, kernels
# active), stock exit 1 (stock files, no kernel library).
#
# usage: bash tests/gpu/e2e/status_installed.sh   (output: $OUT/status_installed.txt)
set -uo pipefail
# shellcheck source=tests/gpu/e2e/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/paths.sh"
PIN="${E2E_STATUS_PIN:-0.26.0}"
mkdir -p "$RESULTS"
LOG="$RESULTS/status_installed.txt"
[[ -d "$SRC/status/cli-site" && -d "$SRC/status/cache/blobs" ]] ||
  { echo "no $SRC/status: run tests/gpu/e2e/pack_status.py and carry .e2e/status" | tee "$LOG"; exit 2; }
[[ -f "$E2E/deps/.complete" && -d "$E2E/vllm-patched/vllm" ]] ||
  { echo "no vLLM sites under $E2E: run device.sh first on this machine" | tee "$LOG"; exit 2; }
CACHE="$E2E/status-cache"
rm -rf "$CACHE" && mkdir -p "$CACHE" && cp -r "$SRC/status/cache/blobs" "$CACHE/"
{
  echo "# dsv4patch status --installed --pin $PIN on $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null || echo 'no GPU')"
  echo "git: $(git --version 2>&1)"
  for v in patched stock; do
    # The vLLM environment's interpreter: this python with the site on its path, nothing of dsv4patch's.
    wrapper="$E2E/python-$v"
    printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$E2E/vllm-$v:$E2E/deps" "$(command -v "$PY")" > "$wrapper"
    chmod +x "$wrapper"
    for fmt in text json; do
      echo "## $v ($fmt)"
      t0=$(date +%s)
      PYTHONPATH="$SRC/status/cli-site:$ROOT" DSV4PATCH_CACHE="$CACHE" "$PY" -m dsv4patch status --installed \
        --pin "$PIN" --lock "$ROOT/locks/vllm.toml" --python "$wrapper" --format "$fmt" 2>&1
      echo "exit code: $? ($(( $(date +%s) - t0 )) s)"
    done
  done
} 2>&1 | tee "$LOG"

#!/usr/bin/env bash
# Device side of the DeepSeek-V4 end-to-end run (issue 15); see README.md here.
#
# Every call: verifies the pieces that arrived in .e2e/ (sha256 from
# .e2e/meta/manifest.json) and keeps them in $E2E/parts (outside the repo copy,
# so they survive while the machine is held).  Once all pieces are there it
# reassembles the xz stream (stdlib lzma), installs the wheels with
# `pip install --no-index --no-deps --target $E2E/site-stock`, splits it into
# $E2E/deps (all but vLLM, shared) and $E2E/vllm-stock, builds $E2E/vllm-patched
# (hard-linked vLLM + the patched .py files from .e2e/meta/patched + the kernel
# plugin wheel from .e2e/meta/plugin), writes the
# tiny model, checks imports in both sites (stops with exit 3 if a module
# DeepSeek-V4 needs does not import), and runs run_e2e.py with the remaining
# arguments, results in $OUT (or $E2E/out).
#
# usage: bash tests/gpu/e2e/device.sh --stage-only
#        bash tests/gpu/e2e/device.sh [--no-run] [run_e2e.py args, e.g. --variants stock --methods plain,mtp1]
set -euo pipefail
T_CALL=$(date +%s)

# shellcheck source=tests/gpu/e2e/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/paths.sh"
STAGE_ONLY=0
NO_RUN=0
if [[ "${1:-}" == "--stage-only" ]]; then STAGE_ONLY=1; shift; fi
if [[ "${1:-}" == "--no-run" ]]; then NO_RUN=1; shift; fi
mkdir -p "$E2E/parts" "$RESULTS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# DeepGEMM and TileLang compile kernels at run time with nvcc.
if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc > /dev/null; then
  CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  export CUDA_HOME
fi

[[ -f "$SRC/meta/manifest.json" ]] || { echo "no $SRC/meta/manifest.json: carry .e2e/meta (run pack.py first)"; exit 2; }
cp "$SRC/meta/manifest.json" "$E2E/manifest.json"

# 0. JIT cache pieces of an earlier machine (E2E_SAVE_CACHES=1 below), when
#    this call carries them as .e2e/jit/: kept in $E2E/jit like the pieces
#    (a call cannot carry them together with a 49 MiB piece), restored in step 4
if compgen -G "$SRC/jit/jit-cache.tar.xz.*" > /dev/null; then
  (cd "$SRC/jit" && sha256sum -c --quiet jit-cache.sha256) || { echo "jit cache pieces: sha256 mismatch"; exit 2; }
  mkdir -p "$E2E/jit" && cp "$SRC"/jit/jit-cache.* "$E2E/jit/"
  echo "jit cache pieces staged: $(ls "$E2E"/jit/jit-cache.tar.xz.* | wc -l)"
fi

# 1. stage and verify the pieces
"$PY" - "$SRC" "$E2E" <<'EOF'
import hashlib, json, shutil, sys
from pathlib import Path
src, e2e = Path(sys.argv[1]), Path(sys.argv[2])
man = json.loads((e2e / "manifest.json").read_text())
have, missing = [], []
for p in man["parts"]:
    dst = e2e / "parts" / p["name"]
    for cand in (src / p["name"], dst):
        if cand.exists() and cand.stat().st_size == p["size"]:
            if hashlib.sha256(cand.read_bytes()).hexdigest() == p["sha256"]:
                if cand != dst:
                    shutil.copyfile(cand, dst)
                break
            print(f"{cand}: sha256 mismatch, ignored")
    (have if dst.exists() else missing).append(p["name"])
print(f"pieces here: {len(have)}/{len(man['parts'])}" + (f"; missing: {' '.join(missing)}" if missing else ""))
(e2e / "parts" / "MISSING").write_text(" ".join(missing))
EOF
if [[ -s "$E2E/parts/MISSING" ]]; then
  echo "carry the missing pieces (one per call), then call again"; exit 0
fi
[[ $STAGE_ONLY == 1 ]] && { echo "all pieces staged"; exit 0; }

# 2. install the stock site once
if [[ ! -f "$E2E/site-stock/.complete" ]]; then
  t0=$(date +%s)
  rm -rf "$E2E/site-stock" "$E2E/wheels"
  "$PY" - "$E2E" <<'EOF'
import hashlib, json, lzma, sys, tarfile
from pathlib import Path
e2e = Path(sys.argv[1])
man = json.loads((e2e / "manifest.json").read_text())
h = hashlib.sha256()
dec = lzma.LZMADecompressor()
tar_path = e2e / "payload.tar"
with tar_path.open("wb") as out:
    for p in man["parts"]:
        data = (e2e / "parts" / p["name"]).read_bytes()
        h.update(data)
        out.write(dec.decompress(data))
if h.hexdigest() != man["xz_sha256"]:
    sys.exit("reassembled stream sha256 mismatch")
with tarfile.open(tar_path) as tar:
    tar.extractall(e2e)
tar_path.unlink()
print("wheels:", len(list((e2e / "wheels").glob("*.whl"))))
EOF
  # E2E_PIP_ARGS: only for trying this script off the device (e.g. --python-version 3.12 --only-binary=:all:)
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir ${E2E_PIP_ARGS:-} --target "$E2E/site-stock" "$E2E"/wheels/*.whl
  rm -rf "$E2E/wheels"
  touch "$E2E/site-stock/.complete"
  echo "stock site installed in $(( $(date +%s) - t0 )) s"
fi

# 3. three directories on PYTHONPATH: deps (everything but vLLM, shared by both
#    variants), vllm-stock and vllm-patched (vLLM alone).  Every JIT cache
#    (DeepGEMM's, TileLang's, FlashInfer's) then sees one install path for the
#    code the variants share: in run 3 the patched engine recompiled DeepGEMM's
#    kernels because its copy of vllm/third_party/deep_gemm lived under another
#    path (DeepGEMM keys its cache on its include path), and its start passed
#    the deadline.  vLLM prefers a top-level `deep_gemm` (vllm/utils/deep_gemm.py),
#    so deps/deep_gemm is vLLM's own vendored copy, hard-linked.
if [[ ! -f "$E2E/deps/.complete" ]]; then
  rm -rf "$E2E/deps"
  mkdir -p "$E2E/deps"
  for f in "$E2E/site-stock"/* "$E2E/site-stock"/.[!.]*; do
    [[ -e "$f" ]] || continue
    case "$(basename "$f")" in vllm|vllm-*.dist-info|.complete) continue ;; esac
    cp -al "$f" "$E2E/deps/"
  done
  cp -al "$E2E/site-stock/vllm/third_party/deep_gemm" "$E2E/deps/deep_gemm"
  touch "$E2E/deps/.complete"
fi
for v in stock patched; do
  rm -rf "$E2E/vllm-$v"
  mkdir -p "$E2E/vllm-$v"
  cp -al "$E2E/site-stock/vllm" "$E2E"/site-stock/vllm-*.dist-info "$E2E/vllm-$v/"
done
n=0
if [[ -d "$SRC/meta/patched/vllm" ]]; then
  while IFS= read -r -d '' f; do
    rel="${f#"$SRC/meta/patched/"}"
    mkdir -p "$(dirname "$E2E/vllm-patched/$rel")"
    rm -f "$E2E/vllm-patched/$rel"   # a hard link: replace, never write through
    cp "$f" "$E2E/vllm-patched/$rel"
    n=$((n + 1))
  done < <(find "$SRC/meta/patched/vllm" -name '*.py' -print0)
fi
echo "patched site: $n patched .py files"
[[ $n == 0 ]] && echo "WARNING: .e2e/meta/patched is empty: the 'patched' variant is stock (run pack.py --patched-tree)"
if compgen -G "$SRC/meta/plugin/*.whl" > /dev/null; then
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir ${E2E_PIP_ARGS:-} --target "$E2E/vllm-patched" "$SRC"/meta/plugin/*.whl
  echo "patched site: kernel plugin $(ls "$SRC"/meta/plugin/*.whl | xargs -n1 basename)"
else
  echo "patched site: no kernel plugin wheel (fix 7's kernels stay stock)"
fi
SITE_STOCK="$E2E/vllm-stock:$E2E/deps"
SITE_PATCHED="$E2E/vllm-patched:$E2E/deps"
# DeepGEMM's warm-up JIT-compiles every GEMM shape the engine might use (2429
# on this model; run 3 spent 470 s in it without finishing); skipped, kernels
# compile when first used.
export VLLM_DEEP_GEMM_WARMUP="${VLLM_DEEP_GEMM_WARMUP:-skip}"

# 4. the JIT caches of an earlier machine, when carried (.e2e/jit/, made by
#    E2E_SAVE_CACHES=1 below): a fresh machine's first engine otherwise spends
#    5 minutes or more compiling (runs 4a and 4e).  Once per machine.
#    Entries written "@name" in jit-cache.dirs are the directory next to
#    E2E_TMP_CACHE (Triton's and Inductor's cache in /tmp), not $HOME's.
TMP_CACHE="${E2E_TMP_CACHE:-/tmp/torchinductor_$(id -un)}"
if compgen -G "$E2E/jit/jit-cache.tar.xz.*" > /dev/null && [[ ! -f "$E2E/jit.restored" ]]; then
  cat "$E2E"/jit/jit-cache.tar.xz.* | xz -d | tar -x --no-same-owner -C "$HOME"
  for d in $(cat "$E2E/jit/jit-cache.dirs" 2>/dev/null); do
    # a plain directory name only (the file is carried data): never ".." or a path
    [[ "$d" =~ ^@[A-Za-z0-9_][A-Za-z0-9._-]*$ && -d "$HOME/${d#@}" ]] || continue
    mkdir -p "$(dirname "$TMP_CACHE")"
    cp -a "$HOME/${d#@}" "$(dirname "$TMP_CACHE")/" && rm -rf "${HOME:?}/${d#@}"
  done
  touch "$E2E/jit.restored"
  echo "jit caches restored into $HOME:$(cat "$E2E/jit/jit-cache.dirs" 2>/dev/null) (@: into $(dirname "$TMP_CACHE"))"
fi
# E2E_SAVE_CACHES=1: at the end of the call, the JIT caches go to $OUT as
# pieces of 15 MiB (at most 8 files come back from a call, 16 MiB each), the
# largest set that fits E2E_CACHE_MAX_MIB (45) compressed.  Carry them as
# .e2e/jit/ in the next session.
save_caches() {
  [[ "${E2E_SAVE_CACHES:-0}" == 1 ]] || return 0
  local max=$(( ${E2E_CACHE_MAX_MIB:-45} * 1048576 )) tmp="$E2E/jit-save" set dirs d
  rm -rf "$tmp" && mkdir -p "$tmp"
  for d in .tilelang .triton .cache/vllm .cache/flashinfer .cache .nv; do
    [[ -d "$HOME/$d" ]] && echo "jit cache candidate: $d $(du -sh "$HOME/$d" | cut -f1)"
  done
  [[ -d "$TMP_CACHE" ]] && echo "jit cache candidate: $TMP_CACHE $(du -sh "$TMP_CACHE" | cut -f1)"
  # anything else a cold start may have written (run 5a: 520 s with only 20 MiB in the sets below)
  # (du exits 1 when a file vanishes while it reads: /tmp changes under it; a survey never stops the call)
  { du -sh "$HOME"/.[!.]* /tmp/* 2>/dev/null || true; } | sort -h | tail -8 | sed 's/^/jit cache survey: /'
  # .nv/ComputeCache: the driver's cache of PTX compiled at load time
  # @tmp: TMP_CACHE (run 6b: /tmp/torchinductor_root, 37 MB, Triton's kernels)
  for set in ".tilelang .triton .cache .nv @tmp" ".tilelang .triton .cache .nv" ".tilelang .triton .cache" ".tilelang .triton .cache/vllm" ".tilelang .cache/vllm/deep_gemm" ".tilelang"; do
    dirs=""
    local args=(-C "$HOME") extra=()
    for d in $set; do
      if [[ "$d" == @tmp ]]; then
        [[ -d "$TMP_CACHE" ]] && dirs="$dirs @$(basename "$TMP_CACHE")" &&
          extra=(-C "$(dirname "$TMP_CACHE")" "$(basename "$TMP_CACHE")")
      elif [[ -d "$HOME/$d" ]]; then
        dirs="$dirs $d" && args+=("$d")
      fi
    done
    [[ -n "$dirs" ]] || continue
    tar -c "${args[@]}" "${extra[@]}" | xz -T0 -6 > "$tmp/jit-cache.tar.xz"
    if (( $(stat -c %s "$tmp/jit-cache.tar.xz") <= max )); then
      (cd "$tmp" && split -b 15M -d jit-cache.tar.xz jit-cache.tar.xz. && rm jit-cache.tar.xz &&
       sha256sum jit-cache.tar.xz.* > jit-cache.sha256 && echo "$dirs" > jit-cache.dirs)
      cp "$tmp"/jit-cache.* "$RESULTS/"
      echo "jit caches saved:$dirs ($(cat "$tmp"/jit-cache.tar.xz.* | wc -c) bytes in $(ls "$tmp"/jit-cache.tar.xz.* | wc -l) pieces)"
      return 0
    fi
    echo "jit caches:$dirs compress to $(stat -c %s "$tmp/jit-cache.tar.xz") bytes, over ${E2E_CACHE_MAX_MIB:-45} MiB"
  done
  echo "jit caches: nothing saved"
}

# 5. the tiny model
"$PY" "$HERE/make_tiny_dsv4.py" "$E2E/tiny-dsv4"
#    and the same network with sliding-window attention only (no compressor,
#    indexer or top-k): `--model /tmp/e2e/tiny-dsv4-swa` tells a
#    compressed-path bug from anything else (run 5's open question)
"$PY" "$HERE/make_tiny_dsv4.py" "$E2E/tiny-dsv4-swa" --compress-ratios 0,0,0,0,0

# 6. import check in both sites, as the engines will see them: a module that
#    DeepSeek-V4 needs and that does not import stops the call here, before any
#    engine start (exit 3; the problems are in preflight.txt and on stdout).
#    E2E_PREFLIGHT_MODULES (comma-separated) replaces the list, for tests only;
#    E2E_PREFLIGHT=warn starts the engines anyway (to read an engine's own error).
#    A clean preflight is remembered for the same pieces and meta (the sites are
#    rebuilt from them identically on every call): later calls on the same
#    machine skip it (~40 s).
PF_KEY="$( (cat "$E2E/manifest.json"; cd "$SRC/meta" && find . -type f -print0 | sort -z | xargs -0 sha256sum;
            echo "${E2E_PREFLIGHT_MODULES:-}") | sha256sum | cut -c1-64)"
if [[ -f "$E2E/preflight.ok" && "$(cat "$E2E/preflight.ok")" == "$PF_KEY" ]]; then
  echo "preflight: passed earlier on this machine for the same pieces and meta (key ${PF_KEY:0:12}); skipped"
elif ! "$PY" "$HERE/run_e2e.py" --preflight --out "$RESULTS" \
    --site stock="$SITE_STOCK" --site patched="$SITE_PATCHED" \
    ${E2E_PREFLIGHT_MODULES:+--preflight-modules "$E2E_PREFLIGHT_MODULES"}; then
  if [[ "${E2E_PREFLIGHT:-strict}" != warn ]]; then
    echo "device.sh: stopping before the engines (fix the imports above: pack.py DEPS, then re-pack)"
    exit 3
  fi
  echo "device.sh: E2E_PREFLIGHT=warn: starting the engines despite the problems above"
else
  echo "$PF_KEY" > "$E2E/preflight.ok"
fi

[[ $NO_RUN == 1 ]] && { save_caches; exit 0; }
# 7. the cases; unless --budget is given, what is left of a 600 s device call (E2E_CALL_LIMIT)
EXTRA=()
if [[ " $* " != *" --budget "* ]]; then
  left=$(( ${E2E_CALL_LIMIT:-600} - ($(date +%s) - T_CALL) - 40 ))
  echo "run budget: $left s"
  EXTRA=(--budget "$left")
fi
PYTHONUNBUFFERED=1 "$PY" "$HERE/run_e2e.py" --model "$E2E/tiny-dsv4" --out "$RESULTS" \
  --site stock="$SITE_STOCK" --site patched="$SITE_PATCHED" "${EXTRA[@]}" "$@" 2>&1 | tee "$RESULTS/run.txt"
save_caches

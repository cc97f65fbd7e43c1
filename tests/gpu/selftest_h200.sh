#!/usr/bin/env bash
# `dsv4patch selftest` on the H200 machine: stock vLLM 0.26.0 (its own wheel, pip-installed), then the
# patched wheel `dsv4patch wheel` makes there from that stock wheel (pip-installed over it).
#
# Here (CPU, network): python tests/gpu/selftest_pack.py  ->  .selftest/manifest.json + part-NN.bin
# On the device, one call per piece (carry .selftest/manifest.json and .selftest/part-NN.bin):
#     bash tests/gpu/selftest_h200.sh stage
# then (carry .selftest/manifest.json only):
#     bash tests/gpu/selftest_h200.sh stock      # install, selftest of the stock wheel -> $OUT/selftest-stock.json
#     bash tests/gpu/selftest_h200.sh wheel      # dsv4patch wheel there (kernels built there), pip install it
#     bash tests/gpu/selftest_h200.sh patched    # (wheel if not done yet,) selftest -> $OUT/selftest-patched.json
#     bash tests/gpu/selftest_h200.sh all        # stock, wheel, patched in one call, if it fits
# Or, to overlap the slow parts with the transfers (what issue 30's run did):
#     bash tests/gpu/selftest_h200.sh prep       # first call, carry .selftest/manifest.json and .selftest/prep
#                                                #   (CLI wheels + the pin's sdist): `dsv4patch apply` builds the
#                                                #   kernel library in the background while the pieces travel
#     bash tests/gpu/selftest_h200.sh stage      # one call per piece
#     ST_END_IN=S bash tests/gpu/selftest_h200.sh launch   # with the last piece: unpack, then in the background
#                                                #   stock and patched at once (own site dirs), all done in S s
#     bash tests/gpu/selftest_h200.sh collect    # wait for the background run, results to $OUT
# Every mode stages the pieces a call carries first, so `stock` may ride with the last piece.
# Both variants are installed into the same directory ($ST/site), so the JIT caches (TileLang,
# DeepGEMM, Triton: keyed on install paths) the stock run fills serve the patched run.
# Environment: ST_DIR (default /tmp/selftest; kept while the machine is held), OUT (results),
# ST_CALL_LIMIT (seconds of the call, default 600), SELFTEST_ARGS (extra selftest options),
# ST_WHEEL_ARGS (extra `dsv4patch wheel` options, e.g. `--arch 9.0` to build the kernels for sm_90 only).
set -euo pipefail
T_CALL=$(date +%s)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SRC="$ROOT/.selftest"
ST="${ST_DIR:-/tmp/selftest}"
RESULTS="${OUT:-$ST/out}"
PY="${PYTHON:-python3}"
MODE="${1:-stage}"
case "$MODE" in prep|stage|stock|wheel|patched|all|launch|driver|collect) ;;
  *) echo "usage: $0 prep|stage|stock|wheel|patched|all|launch|collect" >&2; exit 2 ;; esac
mkdir -p "$ST/parts" "$RESULTS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc > /dev/null; then
  CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  export CUDA_HOME
fi
if [[ "$MODE" == driver ]]; then SRC="$ST/driver-src"; mkdir -p "$SRC"; cp "$ST/manifest.json" "$SRC/"; fi
[[ -f "$SRC/manifest.json" ]] || { echo "no $SRC/manifest.json: carry .selftest/manifest.json (selftest_pack.py)"; exit 2; }
cp "$SRC/manifest.json" "$ST/manifest.json"
CLI_PATH="$ST/cli:$ST/payload/rest/cli-site"

if [[ "$MODE" == collect ]]; then  # wait for the background run of `launch`, then hand its results back
  # ST_CALL_LIMIT must be the call's real limit (the lease may grant less than timeout_s: the reply's
  # limit_s).  What is there is copied to $OUT every few seconds, so a call cut at its limit still
  # brings back the reports finished so far (issue 30's H200 run lost everything to a cut collect).
  limit=$(( ${ST_CALL_LIMIT:-600} - 30 ))
  copy_back() {  # at most 8 files come back: the two reports and their engine logs, the rest in one archive
    for f in selftest-stock.json selftest-patched.json selftest-stock-logs.tgz selftest-patched-logs.tgz; do
      [[ -f "$ST/out/$f" ]] && cp "$ST/out/$f" "$RESULTS/$f.tmp" && mv "$RESULTS/$f.tmp" "$RESULTS/$f"
    done
    cp "$ST/driver.log" "$ST/out/driver.log" 2>/dev/null || true
    (cd "$ST/out" && tar czf "$RESULTS/misc.tmp" --exclude='selftest-*.json' --exclude='*-logs.tgz' --exclude='*.tmp' . &&
      mv "$RESULTS/misc.tmp" "$RESULTS/selftest-run-misc.tgz") 2>/dev/null || true
  }
  while [[ ! -f "$ST/driver.done" ]] && (( $(date +%s) - T_CALL < limit )); do copy_back; sleep 10; done
  copy_back
  [[ -f "$ST/driver.done" ]] && echo "background run finished: $(cat "$ST/driver.done")" || echo "background run still going"
  tail -40 "$ST/driver.log" 2>/dev/null || true
  exit 0
fi

if [[ "$MODE" == prep ]]; then  # CLI wheels + sdist carried in .selftest/prep; kernel build in the background
  git --version
  mkdir -p "$ST/cache/blobs/sha256" "$ST/cli"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ST/cli" "$SRC"/prep/cli/*.whl
  for b in "$SRC"/prep/sdist/*; do cp "$b" "$ST/cache/blobs/sha256/$(basename "$b")"; done
  rm -rf "$ST/repo" && mkdir -p "$ST/repo"
  (cd "$ROOT" && tar cf - --exclude=./.selftest --exclude=./.git .) | tar xf - -C "$ST/repo"
  setsid bash -c "cd '$ST/repo' && PYTHONPATH='$CLI_PATH:$ST/repo' DSV4PATCH_CACHE='$ST/cache' '$PY' -m dsv4patch \
      apply --lock '$ST/repo/locks/vllm.toml' --pin 0.26.0 --tree '$ST/tree' --python '$PY' --format json \
      > '$ST/prebuild.json' 2> '$ST/prebuild.log'; echo \$? > '$ST/prebuild.rc'" < /dev/null > /dev/null 2>&1 &
  sleep 10; echo "prep: kernel build started in the background"; tail -5 "$ST/prebuild.log" || true
  exit 0
fi
[[ -f "$ST/prebuild.rc" ]] && echo "background apply + kernel build: exit $(cat "$ST/prebuild.rc")" ||
  { [[ -f "$ST/prebuild.log" ]] && echo "background apply + kernel build running: $(tail -c 300 "$ST/prebuild.log" | tr '\n' ' ')"; }

# 1. stage the pieces this call carries (verified), say what is missing
"$PY" - "$SRC" "$ST" <<'EOF'
import hashlib, json, shutil, sys
from pathlib import Path
src, st = Path(sys.argv[1]), Path(sys.argv[2])
man = json.loads((st / "manifest.json").read_text())
missing = []
for p in man["parts"]:
    dst = st / "parts" / p["name"]
    for cand in (src / p["name"], dst):
        if cand.is_file() and cand.stat().st_size == p["size"]:
            if hashlib.sha256(cand.read_bytes()).hexdigest() == p["sha256"]:
                if cand != dst:
                    shutil.copyfile(cand, dst)
                break
            print(f"{cand}: sha256 mismatch, ignored")
    if not dst.exists():
        missing.append(p["name"])
print(f"pieces here: {len(man['parts']) - len(missing)}/{len(man['parts'])}"
      + (f"; missing: {' '.join(missing)}" if missing else ""))
(st / "parts" / "MISSING").write_text(" ".join(missing))
EOF
if [[ -s "$ST/parts/MISSING" ]]; then echo "carry the missing pieces (one per call), then call again"; exit 0; fi
[[ "$MODE" == stage ]] && { echo "all pieces staged"; exit 0; }

# 2. unpack once: the stock wheel into the cache as the lock's blob, the rest beside it
if [[ ! -f "$ST/unpacked.ok" ]]; then
  t0=$(date +%s)
  rm -rf "$ST/payload" && mkdir -p "$ST/payload"
  "$PY" - "$ST" <<'EOF'
import hashlib, json, lzma, os, sys, tarfile
from pathlib import Path
st = Path(sys.argv[1])
man = json.loads((st / "manifest.json").read_text())
h = hashlib.sha256()
with (st / "payload.tar").open("wb") as out:
    for p in man["parts"]:
        data = (st / "parts" / p["name"]).read_bytes()
        h.update(data)
        out.write(data)
if h.hexdigest() != man["payload_sha256"]:
    sys.exit("reassembled payload: sha256 mismatch")
with tarfile.open(st / "payload.tar") as tar:
    tar.extractall(st / "payload", filter="data")
(st / "payload.tar").unlink()
wheel = st / "payload" / "vllm.whl"
sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
if sha != man["stock_wheel"]["sha256"]:
    sys.exit(f"stock wheel sha256 {sha} is not the lock's {man['stock_wheel']['sha256']}")
with lzma.open(st / "payload" / "rest.tar.xz") as fh, tarfile.open(fileobj=fh) as tar:
    tar.extractall(st / "payload" / "rest", filter="data")
(st / "payload" / "rest.tar.xz").unlink()
blobs = st / "cache" / "blobs" / "sha256"
blobs.mkdir(parents=True, exist_ok=True)
os.replace(st / "payload" / "rest" / man["sdist"]["blob"], blobs / man["sdist"]["sha256"])
named = st / "payload" / man["stock_wheel"]["name"]  # pip wants the wheel's own file name
os.replace(wheel, named)
os.link(named, blobs / man["stock_wheel"]["sha256"])  # the blob dsv4patch wheel reads (the lock's sha256)
print("payload unpacked:", len(man["deps"]), "dependency wheels, stock wheel", named.name)
EOF
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ST/deps" \
    "$ST"/payload/rest/deps/*.whl
  touch "$ST/unpacked.ok"
  echo "unpacked and dependencies installed in $(( $(date +%s) - t0 )) s"
fi

# 3. the vLLM environment's interpreter: python3 with the vLLM site and its dependencies, nothing of
#    dsv4patch's; .pth files of the --target dirs (nvidia-cutlass-dsl's) resolved as Python would
vllm_python() {  # $1 = site dir (default $ST/site), $2 = wrapper path (default $ST/python-vllm)
  local extra site="${1:-$ST/site}" wrapper="${2:-$ST/python-vllm}"
  extra="$("$PY" -S -c 'import site, sys; b = list(sys.path); [site.addsitedir(d) for d in sys.argv[1:]]; print(":".join(p for p in sys.path if p not in b and p not in sys.argv[1:]))' "$site" "$ST/deps")"
  printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$site:$ST/deps${extra:+:$extra}" "$(command -v "$PY")" > "$wrapper"
  chmod +x "$wrapper"
}
CLI_ROOT="$ROOT"; [[ "$MODE" == driver ]] && CLI_ROOT="$ST/repo"
CLI_ENV=(env "PYTHONPATH=$CLI_PATH:$CLI_ROOT" "DSV4PATCH_CACHE=$ST/cache")

run_selftest() {  # $1 = variant, $2 = share of the call's time left (percent, default 100)
  local v="$1" left rc=0 wrap="${WRAP:-$ST/python-vllm}"
  vllm_python "${SITE:-$ST/site}" "$wrap"
  left=$(( (${ST_CALL_LIMIT:-600} - ($(date +%s) - T_CALL) - 25) * ${2:-100} / 100 ))
  [[ -n "${ST_END:-}" ]] && left=$(( ST_END - $(date +%s) - 15 ))
  echo "== selftest $v: $(( left )) s left in this call"
  { nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1 || true
    "$wrap" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 || true
  } | tee "$RESULTS/selftest-$v.env.txt"
  # shellcheck disable=SC2086
  "${CLI_ENV[@]}" PYTHONUNBUFFERED=1 "$PY" -m dsv4patch selftest --python "$wrap" \
    --lock "$ROOT/locks/vllm.toml" --pin 0.26.0 --force-sm120-topk --parallel "${ST_PARALLEL:-6}" \
    --start-deadline "${ST_START_DEADLINE:-420}" --case-deadline "${ST_CASE_DEADLINE:-90}" \
    --deadline "$left" --work "$ST/work-$v" --format json ${SELFTEST_ARGS:-} \
    > "$RESULTS/selftest-$v.json" 2> "$RESULTS/selftest-$v.stderr.txt" || rc=$?
  echo "selftest $v: exit $rc" | tee -a "$RESULTS/selftest-$v.env.txt"
  "$PY" - "$RESULTS/selftest-$v.json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
for c in d.get("checks", []):
    print(f"{c['name']:<28} {'pass' if c['ok'] else 'FAIL' if c['ok'] is False else 'not run'}  {c.get('note') or ''}"[:300])
for c in d.get("cases", []):
    acc = c.get("acceptance") or {}
    print(f"{c['case']:<28} {c['verdict']:<12} gap={c.get('min_gap')} acc={acc.get('accepted')}/{acc.get('drafted')} "
          f"{(c.get('error') or '')[:160]}")
print("min_gap", d.get("min_gap"), "counts", d.get("counts"), "ok", d.get("ok"))
EOF
  # the engines' full logs come back in one file (at most 8 files come back from a call)
  tar czf "$RESULTS/selftest-$v-logs.tgz" -C "$ST" "work-$v" 2>/dev/null || true
}

pip_target() {  # $1 = target dir, then wheels: pip as the device allows it (offline, no deps, no cache)
  local dir="$1"; shift
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dir" "$@"
}

build_patched_wheel() {  # `dsv4patch wheel` into $ST/dist: a packed kernel wheel, else kernels built here
  local t0 kernels=(--python "$PY")  # build the kernel library here, against this machine's torch
  t0=$(date +%s)
  if compgen -G "$ST/payload/rest/kernels/*.whl" > /dev/null; then
    kernels=(--kernels "$(ls "$ST"/payload/rest/kernels/*.whl | head -1)")
  fi
  rm -rf "$ST/dist"
  # shellcheck disable=SC2086
  "${CLI_ENV[@]}" "$PY" -m dsv4patch wheel --lock "$CLI_ROOT/locks/vllm.toml" --pin 0.26.0 --out "$ST/dist" \
    "${kernels[@]}" ${ST_WHEEL_ARGS:-} --format json > "$RESULTS/wheel-patched.json" 2> "$RESULTS/wheel-patched.stderr.txt" ||
    { echo "dsv4patch wheel failed:"; tail -20 "$RESULTS/wheel-patched.stderr.txt"; return 1; }
  echo "patched wheel built in $(( $(date +%s) - t0 )) s: $(ls "$ST"/dist/*.whl)"
}

install_stock() {
  [[ -f "$ST/stock.installed" ]] && { echo "stock wheel installed earlier on this machine"; return 0; }
  rm -rf "$ST/site" "$ST/patched.installed"
  t0=$(date +%s)
  pip_target "$ST/site" "$ST"/payload/vllm-*.whl
  touch "$ST/stock.installed"
  echo "stock wheel installed in $(( $(date +%s) - t0 )) s"
}

install_patched() {
  [[ -f "$ST/patched.installed" ]] && { echo "patched wheel installed earlier on this machine: $(cat "$ST/patched.installed")"; return 0; }
  build_patched_wheel || return 1
  [[ -f "$ST/stock.installed" ]] || install_stock
  t0=$(date +%s)
  # as `pip install --force-reinstall` in a venv: the stock distribution goes first (its dist-info has
  # another name than the patched one's, and two would leave importlib.metadata to pick), then the
  # patched wheel into the same directory
  rm -rf "$ST"/site/vllm "$ST"/site/vllm-*.dist-info "$ST"/site/dsv4patch_kernels_* "$ST/stock.installed"
  pip_target "$ST/site" "$ST"/dist/vllm-*.whl
  echo "patched wheel installed in place of the stock one in $(( $(date +%s) - t0 )) s"
  ls "$ST"/dist/vllm-*.whl > "$ST/patched.installed"
}

launch() {  # unpacked: the driver in its own session, so it runs on after this call returns
  local end=$(( $(date +%s) + ${ST_END_IN:-560} ))
  if [[ ! -f "$ST/repo/tests/gpu/selftest_h200.sh" ]]; then
    mkdir -p "$ST/repo" && (cd "$ROOT" && tar cf - --exclude=./.selftest --exclude=./.git .) | tar xf - -C "$ST/repo"
  fi
  rm -f "$ST/driver.done"
  ST_END="$end" setsid bash "$ST/repo/tests/gpu/selftest_h200.sh" driver < /dev/null > /dev/null 2>&1 &
  sleep 5; echo "launched: stock and patched at once, everything ends by $(date -u -d "@$end" +%H:%M:%S) UTC"
  tail -5 "$ST/driver.log" 2>/dev/null || true
}

driver() {  # stock and patched at once, each in its own site dir and HOME (own JIT caches, no races)
  exec > "$ST/driver.log" 2>&1
  RESULTS="$ST/out"; mkdir -p "$RESULTS"; unset XDG_CACHE_HOME
  local t0; t0=$(date +%s)
  rm -rf "$ST/site-stock" "$ST/site-patched"
  pip_target "$ST/site-stock" "$ST"/payload/vllm-*.whl
  echo "stock wheel installed in $(( $(date +%s) - t0 )) s"
  ( SITE="$ST/site-stock" WRAP="$ST/python-vllm-stock" HOME="$ST/home-stock" SELFTEST_ARGS="${ST_STOCK_ARGS:-}" \
      run_selftest stock ) &
  local stock_pid=$!
  while [[ ! -f "$ST/prebuild.rc" ]] && (( $(date +%s) < ST_END - 120 )); do sleep 3; done
  echo "background apply + kernel build: exit $(cat "$ST/prebuild.rc" 2>/dev/null || echo 'not finished')"
  if build_patched_wheel; then
    t0=$(date +%s)
    pip_target "$ST/site-patched" "$ST"/dist/vllm-*.whl
    echo "patched wheel installed in $(( $(date +%s) - t0 )) s"
    ( SITE="$ST/site-patched" WRAP="$ST/python-vllm-patched" HOME="$ST/home-patched" \
        SELFTEST_ARGS="${ST_PATCHED_ARGS:-}" run_selftest patched ) &
    wait $!
  fi
  wait "$stock_pid" || true
  cp "$ST/prebuild.log" "$RESULTS/prebuild.stderr.txt" 2>/dev/null || true
  date -u +%H:%M:%S > "$ST/driver.done"
}

case "$MODE" in
  launch) launch ;;
  driver) driver ;;
  stock) install_stock; run_selftest stock ;;
  wheel) install_patched ;;
  patched) install_patched; run_selftest patched ;;
  all) install_stock; run_selftest stock 50; install_patched; run_selftest patched ;;
esac

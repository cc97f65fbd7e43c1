#!/usr/bin/env bash
# `dsv4patch selftest` on the H200 machine, one variant at a time: stock vLLM 0.26.0 (its own wheel,
# pip-installed), then the patched wheel `dsv4patch wheel` makes there from that stock wheel and the packed
# kernel wheel (pip-installed in its place, same site directory and HOME: the JIT caches the stock run
# filled serve the patched one).
#
# Here (CPU, network), one command:  python tests/gpu/selftest_pack.py   ->  .selftest/manifest.json + part-NN.bin
# On the device (docs/selftest.md "On the H200"):
#     bash tests/gpu/selftest_h200.sh stage      # one call per piece: carry .selftest/manifest.json + .selftest/part-NN.bin
#     bash tests/gpu/selftest_h200.sh stock      # the stock run (with the last piece, or alone)
#     bash tests/gpu/selftest_h200.sh patched    # build + install the patched wheel, the patched run
#     ST_RUN=patched-warm bash tests/gpu/selftest_h200.sh patched   # the same again, warm caches
# Every mode stages the pieces its call carries first.  A run is in the foreground and ends before the
# call does (--deadline: the call's time left, ST_CALL_LIMIT = the reply's limit_s, default 600, less a
# margin for packing the results), or, with ST_SPAN=S, in the background in a session of its own with
# --deadline S: the call waits for it and hands back what is there at its end; then
#     ST_RUN=NAME bash tests/gpu/selftest_h200.sh collect          # waits on, hands back the results
# (call again within the machine's 30 s idle time: the background run ends with the machine).  $OUT gets, per run NAME: selftest-NAME.json (the verb's report),
# selftest-NAME.txt (its table), selftest-NAME.env.txt (machine, versions, timings), selftest-NAME-work.tgz
# (engine logs, stacks, hang probes, events, each regression file's log and JUnit XML); and wheel-patched.json.
# Environment: ST_DIR (default /tmp/selftest; kept while the machine is held), OUT, ST_CALL_LIMIT,
# ST_RUN (run name; default the mode), SELFTEST_ARGS (replaces the mode's default cases and deadlines),
# SELFTEST_TOPOLOGY (added to either: e.g. "--tensor-parallel-size 2" on nvidia-h200-x2; docs/selftest.md).
set -euo pipefail
T_CALL=$(date +%s)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SRC="$ROOT/.selftest"
ST="${ST_DIR:-/tmp/selftest}"
RESULTS="${OUT:-$ST/out}"
PY="${PYTHON:-python3}"
MODE="${1:-stage}"
case "$MODE" in stage|stock|patched|collect|bg-stock|bg-patched) ;;
  *) echo "usage: $0 stage|stock|patched|collect" >&2; exit 2 ;; esac
mkdir -p "$ST/parts" "$RESULTS" "$ST/home"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc > /dev/null; then
  CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  export CUDA_HOME
fi
copy_back() {  # $1 = run name: what is there of its results, into $OUT (at most 8 files come back)
  local n="$1" f
  [[ "$RESULTS" == "$ST/out-$n" ]] && return 0
  for f in "$ST/out-$n"/*; do [[ -f "$f" ]] && cp "$f" "$RESULTS/$(basename "$f").tmp" && mv "$RESULTS/$(basename "$f").tmp" "$RESULTS/$(basename "$f")"; done
  return 0
}
wait_for() {  # $1 = run name: until its background run is done or this call is nearly over, copying as it goes
  local n="$1" limit=$(( ${ST_CALL_LIMIT:-600} - 20 ))
  [[ -f "$ST/$n.started" ]] || { echo "no run $n on this machine (a fresh machine: start it again)"; return 0; }
  while [[ ! -f "$ST/$n.done" ]] && (( $(date +%s) - T_CALL < limit )); do  # results copied every 10 s, the end seen within 1 s
    copy_back "$n"
    for _ in 1 2 3 4 5 6 7 8 9 10; do [[ -f "$ST/$n.done" ]] && break; sleep 1; done
  done
  copy_back "$n"
  if [[ -f "$ST/$n.done" ]]; then echo "run $n finished: $(cat "$ST/$n.done")"; cat "$ST/out-$n/selftest-$n.txt" 2> /dev/null || true
  else echo "run $n still going ($(( $(date +%s) - $(stat -c %Y "$ST/$n.started") )) s): collect again"; tail -3 "$ST/$n.log" 2> /dev/null || true; fi
}
if [[ "$MODE" == collect ]]; then wait_for "${ST_RUN:?name the run: ST_RUN=...}"; exit 0; fi
if [[ "$MODE" != bg-* ]]; then
  [[ -f "$SRC/manifest.json" ]] || { echo "no $SRC/manifest.json: carry .selftest/manifest.json (selftest_pack.py)"; exit 2; }
  cp "$SRC/manifest.json" "$ST/manifest.json"
fi

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
if [[ -n "${ST_SPAN:-}" && "$MODE" != bg-* ]]; then  # the run in its own session; this call waits on it
  name="${ST_RUN:-$MODE}"
  rm -rf "$ST/out-$name" "$ST/$name.done" && mkdir -p "$ST/out-$name" && touch "$ST/$name.started"
  # the background run gets its own copy of the checkout: the next call's tree replaces this one
  rm -rf "$ST/repo-$name" && mkdir -p "$ST/repo-$name" && (cd "$ROOT" && tar cf - --exclude=./.selftest --exclude=./.git .) | tar xf - -C "$ST/repo-$name"
  mkdir -p "$ST/repo-$name/.selftest" && cp "$ST/manifest.json" "$ST/repo-$name/.selftest/"
  OUT="$ST/out-$name" ST_RUN="$name" ST_DEADLINE_AT=$(( $(date +%s) + ST_SPAN )) \
    setsid bash "$ST/repo-$name/tests/gpu/selftest_h200.sh" "bg-$MODE" < /dev/null > "$ST/$name.log" 2>&1 &
  echo "run $name started in the background: it ends by $(date -u -d "@$(( $(date +%s) + ST_SPAN ))" +%H:%M:%S) UTC"
  wait_for "$name"
  exit 0
fi

# 2. unpack once: the stock wheel into the cache as the lock's blob, the rest beside it
if [[ ! -f "$ST/unpacked.ok" ]]; then
  t0=$(date +%s)
  rm -rf "$ST/payload" && mkdir -p "$ST/payload"
  "$PY" - "$ST" "$HERE" <<'EOF'
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
sys.path.insert(0, sys.argv[2])
from safe_untar import extract  # tarfile's data filter, or its refusals where this Python lacks it

with tarfile.open(st / "payload.tar") as tar:
    extract(tar, st / "payload")
(st / "payload.tar").unlink()
wheel = st / "payload" / "vllm.whl"
sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
if sha != man["stock_wheel"]["sha256"]:
    sys.exit(f"stock wheel sha256 {sha} is not the lock's {man['stock_wheel']['sha256']}")
with lzma.open(st / "payload" / "rest.tar.xz") as fh, tarfile.open(fileobj=fh) as tar:
    extract(tar, st / "payload" / "rest")
(st / "payload" / "rest.tar.xz").unlink()
blobs = st / "cache" / "blobs" / "sha256"
blobs.mkdir(parents=True, exist_ok=True)
os.replace(st / "payload" / "rest" / man["sdist"]["blob"], blobs / man["sdist"]["sha256"])
named = st / "payload" / man["stock_wheel"]["name"]  # pip wants the wheel's own file name
os.replace(wheel, named)
os.link(named, blobs / man["stock_wheel"]["sha256"])  # the blob dsv4patch wheel reads (the lock's sha256)
print("payload unpacked:", len(man["deps"]), "dependency wheels,", len(man["cli"]), "CLI wheels, stock wheel",
      named.name, "kernel wheel", man["kernels"])
EOF
  pip_target() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
  pip_target "$ST/deps" "$ST"/payload/rest/deps/*.whl
  pip_target "$ST/cli" "$ST"/payload/rest/cli/*.whl
  touch "$ST/unpacked.ok"
  echo "unpacked and dependencies installed in $(( $(date +%s) - t0 )) s"
fi
pip_target() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }

# 3. the vLLM environment's interpreter: python3 with the vLLM site and its dependencies (py-spy's bin on
#    PATH for the hang probe), nothing of dsv4patch's; .pth files of the --target dirs resolved as Python would
vllm_python() {
  local extra
  extra="$("$PY" -S -c 'import site, sys; b = list(sys.path); [site.addsitedir(d) for d in sys.argv[1:]]; print(":".join(p for p in sys.path if p not in b and p not in sys.argv[1:]))' "$ST/site" "$ST/deps")"
  printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$ST/site:$ST/deps${extra:+:$extra}" "$(command -v "$PY")" > "$ST/python-vllm"
  chmod +x "$ST/python-vllm"
}
CLI_ENV=(env "PYTHONPATH=$ST/cli:$ROOT" "DSV4PATCH_CACHE=$ST/cache" "HOME=$ST/home" "PATH=$ST/deps/bin:$ST/cli/bin:$PATH")

install_stock() {
  [[ -f "$ST/stock.installed" ]] && { echo "stock wheel installed earlier on this machine"; return 0; }
  rm -rf "$ST/site" "$ST/patched.installed"
  local t0; t0=$(date +%s)
  pip_target "$ST/site" "$ST"/payload/vllm-*.whl
  touch "$ST/stock.installed"
  echo "stock wheel installed in $(( $(date +%s) - t0 )) s"
}

install_patched() {  # `dsv4patch wheel` with the packed kernel wheel, then pip-installed in place of the stock one
  [[ -f "$ST/patched.installed" ]] && { echo "patched wheel installed earlier: $(cat "$ST/patched.installed")"; return 0; }
  [[ -d "$ST/site" ]] || install_stock
  local t0 kernels; t0=$(date +%s)
  kernels="$(ls "$ST"/payload/rest/kernels/*.whl 2> /dev/null | head -1)"
  [[ -n "$kernels" ]] || { echo "no kernel wheel in the pack: run selftest_pack.py again"; return 1; }
  rm -rf "$ST/dist"
  "${CLI_ENV[@]}" "$PY" -m dsv4patch wheel --lock "$ROOT/locks/vllm.toml" --pin 0.26.0 --out "$ST/dist" \
    --kernels "$kernels" --format json > "$RESULTS/wheel-patched.json" 2> "$ST/wheel-patched.stderr.txt" ||
    { echo "dsv4patch wheel failed:"; tail -20 "$ST/wheel-patched.stderr.txt"; return 1; }
  echo "patched wheel built in $(( $(date +%s) - t0 )) s: $(ls "$ST"/dist/vllm-*.whl)"
  t0=$(date +%s)
  # as `pip install --force-reinstall` in a venv: the stock distribution goes first (its dist-info has
  # another name than the patched one's), then the patched wheel into the same directory
  rm -rf "$ST"/site/vllm "$ST"/site/vllm-*.dist-info "$ST"/site/dsv4patch_kernels_* "$ST/stock.installed"
  pip_target "$ST/site" "$ST"/dist/vllm-*.whl
  ls "$ST"/dist/vllm-*.whl > "$ST/patched.installed"
  echo "patched wheel installed in place of the stock one in $(( $(date +%s) - t0 )) s"
}

run_selftest() {  # $1 = run name; the cases: SELFTEST_ARGS, else the mode's defaults
  local name="$1" left rc=0 t0 args
  vllm_python
  left=$(( ${ST_CALL_LIMIT:-600} - ($(date +%s) - T_CALL) - 45 ))
  [[ -n "${ST_DEADLINE_AT:-}" ]] && left=$(( ST_DEADLINE_AT - $(date +%s) - 30 ))
  if [[ -n "${SELFTEST_ARGS:-}" ]]; then args="$SELFTEST_ARGS"
  # The start deadlines are the verb's own (the first engine's cold default, the others' from its measured
  # start): a fixed --start-deadline here cut a fresh machine's first engine while it still compiled.
  elif [[ "$MODE" == *stock ]]; then  # what stock must fail: the files, the series' tests, fixes 6/7 on SM120's route
    args="--cases installed,regression,mtp1-sm120topk --force-sm120-topk --case-deadline 60"
  else args="--force-sm120-topk --case-deadline 90"; fi
  args="$args ${SELFTEST_TOPOLOGY:-}"
  echo "== selftest $name: $left s left in this call; $args"
  { date -u +"%F %T UTC"; nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.used,memory.total --format=csv,noheader 2>&1 || true
    "$ST/python-vllm" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1 || true
    command -v py-spy cuda-gdb 2>&1 || true
  } > "$RESULTS/selftest-$name.env.txt"
  t0=$(date +%s)
  rm -rf "$ST/work-$name"
  # shellcheck disable=SC2086
  "${CLI_ENV[@]}" PYTHONUNBUFFERED=1 "$PY" -m dsv4patch selftest --python "$ST/python-vllm" \
    --lock "$ROOT/locks/vllm.toml" --pin 0.26.0 --deadline "$left" --work "$ST/work-$name" $args --format json \
    > "$RESULTS/selftest-$name.json" 2> "$ST/selftest-$name.stderr.txt" || rc=$?
  echo "selftest $name: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$RESULTS/selftest-$name.env.txt"
  tail -5 "$ST/selftest-$name.stderr.txt" >> "$RESULTS/selftest-$name.env.txt" || true
  "$PY" - "$RESULTS/selftest-$name.json" > "$RESULTS/selftest-$name.txt" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
for n in d.get("notes", []):
    print(n)
for c in d.get("checks", []):
    print(f"{c['name']:<28} {'pass' if c['ok'] else 'FAIL' if c['ok'] is False else 'not run'}  {c.get('note') or ''}"[:600])
    for f in c.get("files", []):
        bad = [t for t in f["tests"] if t["outcome"] != "passed"]
        print(f"   {f['file']:<72} {f['status']:<8} {f['counts']} {f['devices']} {f['seconds']}s {f.get('error') or ''}")
        for t in bad[:6]:
            print(f"      {t['outcome']}: {t['test']}: {(t['message'] or '')[:300]}")
for e in d.get("engines", []):
    print(f"engine {e['engine']['name']:<16} {e['outcome']:<8} start {e['start_seconds']}s of {e.get('start_deadline')} "
          f"launched +{e.get('launched_at')}s reserved {e.get('gpu_reserved_bytes')} topology {e.get('topology')} "
          f"devices {e.get('devices')} {(e.get('detail') or '')[:400]}")
for c in d.get("cases", []):
    acc, exp = c.get("acceptance") or {}, c.get("expected_acceptance") or {}
    print(f"{c['case']:<28} {c['verdict']:<12} gap={c.get('min_gap')} acc={acc.get('accepted')}/{acc.get('drafted')} "
          f"exp={exp.get('accepted')}/{exp.get('drafted')} {c.get('seconds')}s {(c.get('error') or '')[:200]}"
          + (f" null-block {c['null_block']}"[:300] if c.get("null_block") else ""))
print("min_gap", d.get("min_gap"), "counts", d.get("counts"), "ok", d.get("ok"), "seconds", d.get("seconds"))
EOF
  cat "$RESULTS/selftest-$name.txt" || true
  tar czf "$RESULTS/selftest-$name-work.tgz" -C "$ST" "work-$name" selftest-"$name".stderr.txt 2> /dev/null || true
}

case "$MODE" in
  stock) install_stock; run_selftest "${ST_RUN:-stock}" ;;
  patched) install_patched; run_selftest "${ST_RUN:-patched}" ;;
  bg-stock|bg-patched)  # in its own session (ST_SPAN): the results into $OUT = $ST/out-NAME, then the marker
    rc=0
    if [[ "$MODE" == bg-stock ]]; then install_stock || rc=$?; else install_patched || rc=$?; fi
    (( rc == 0 )) && { run_selftest "$ST_RUN" || rc=$?; }
    date -u +"%H:%M:%S UTC, exit $rc" > "$ST/$ST_RUN.done" ;;
esac

# shellcheck shell=bash
# Where the device-side e2e scripts (device.sh, status_installed.sh) find and put things; sourced by both.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
E2E="${E2E_DIR:-/tmp/e2e}"     # work directory on the device (sites, pieces, caches)
SRC="${E2E_SRC:-$ROOT/.e2e}"   # what the call carried
RESULTS="${OUT:-$E2E/out}"     # what comes back
PY="${PYTHON:-python3}"

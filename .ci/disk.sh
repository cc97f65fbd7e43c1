# Disk report for .ci/run (sourced, bash): the free space at the start, a background
# sampler of the used bytes of each filesystem involved (df, every few seconds) and of
# pytest's basetemp (du, every 30 s), and at the end the peaks and what holds the space.
# CI once failed with ENOSPC ("No space left on device"); this says how close a run came
# and, when a run fails with the disk full, says so plainly.  The report never fails
# the run: every command in it may fail and is ignored.
#
#   disk_start PATH...     df -h of PATHs, start the sampler (call once)
#   disk_phase NAME        mark the phase the next samples belong to (main job, pytest)
#   disk_finish RC         stop the sampler, print peaks and du of the caches (EXIT trap)

DISK_INTERVAL=${DISK_INTERVAL:-3}
DISK_LOW_BYTES=$((512 * 1024 * 1024))  # less free than this at a sample: the disk "ran out"
_disk_pid=""
_disk_dir=""
_disk_paths=()

_disk_human() {  # bytes -> "12.3G" (powers of 1024, as df -h)
    numfmt --to=iec --format=%.1f "$1" 2>/dev/null || echo "$1 B"
}

_disk_pytest_root() {  # pytest's basetemp root: under $PYTEST_DEBUG_TEMPROOT, else /dev/shm where the
    # run made one there (tests/conftest.py puts it on that tmpfs when it has room), else $TMPDIR
    local user
    user=$(id -un 2>/dev/null || echo root)
    if [ -n "${PYTEST_DEBUG_TEMPROOT:-}" ]; then echo "$PYTEST_DEBUG_TEMPROOT/pytest-of-$user"
    elif [ -d "/dev/shm/pytest-of-$user" ]; then echo "/dev/shm/pytest-of-$user"
    else echo "${TMPDIR:-/tmp}/pytest-of-$user"; fi
}

# The sampler runs in a subshell and keeps its peaks in shell variables, so it writes
# nothing to disk while the disk may be full; on TERM it prints them to stdout and exits
# 3 if free space fell below DISK_LOW_BYTES at any sample (else 0).
_disk_sampler() {
    set +euo pipefail
    local -A peak=() size=() low=() at=()
    local phase="setup" tick=0 tpeak=0 ttop="" sleeper=""
    local phase_file="$_disk_dir/phase" root
    local du_every=$((30 / DISK_INTERVAL))
    [ "$du_every" -ge 1 ] || du_every=1
    _disk_report() {
        local t ran_out=0
        [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
        echo "== disk: peak used per filesystem (sampled every ${DISK_INTERVAL}s)"
        for t in "${!peak[@]}"; do
            echo "   $t: peak $(_disk_human "${peak[$t]}") used of $(_disk_human "${size[$t]}")," \
                 "least free $(_disk_human "${low[$t]}") (${at[$t]})"
            [ "${low[$t]}" -lt "$DISK_LOW_BYTES" ] && ran_out=1
        done
        echo "== disk: pytest basetemp ($root) peak $(_disk_human "$tpeak"); its biggest entries then:"
        [ -n "$ttop" ] && printf '%s\n' "$ttop" | sed 's/^/   /'
        exit $((ran_out * 3))
    }
    trap _disk_report TERM
    while :; do
        [ -r "$phase_file" ] && read -r phase <"$phase_file"
        # target used avail size, one line per filesystem (the paths may share one)
        while read -r t used avail total; do
            [ -n "$t" ] || continue
            size[$t]=$total
            if [ "${peak[$t]:-0}" -lt "$used" ]; then peak[$t]=$used; fi
            if [ -z "${low[$t]:-}" ] || [ "${low[$t]}" -gt "$avail" ]; then
                low[$t]=$avail
                at[$t]="$(date -u +%H:%M:%S) during $phase"
            fi
        done < <(df -P -B1 "${_disk_paths[@]}" 2>/dev/null | awk 'NR > 1 {print $6, $3, $4, $2}' | sort -u)
        root=$(_disk_pytest_root)  # where the run put it: known once it has begun
        if [ $((tick % du_every)) -eq 0 ] && [ -d "$root" ]; then
            local now
            now=$(nice du -sxB1 "$root" 2>/dev/null | cut -f1)
            if [ -n "$now" ] && [ "$now" -gt "$tpeak" ]; then
                tpeak=$now
                ttop=$(nice du -xB1 -d 3 "$root" 2>/dev/null | sort -rn | head -12 |
                       while read -r b p; do echo "$(_disk_human "$b") ${p#"$root"/}"; done)
            fi
        fi
        tick=$((tick + 1))
        sleep "$DISK_INTERVAL" &
        sleeper=$!
        wait "$sleeper"
        sleeper=""
    done
}

disk_start() {
    _disk_paths=("$@")
    [ -d "$HOME" ] && _disk_paths+=("$HOME")
    _disk_paths+=("${TMPDIR:-/tmp}")
    [ -d /var/lib/docker ] && _disk_paths+=(/var/lib/docker)
    [ -d /dev/shm ] && _disk_paths+=(/dev/shm)  # tmpfs (memory): the tests' basetemp when it has room
    echo "== disk at start:"
    df -h "${_disk_paths[@]}" 2>/dev/null | awk 'NR == 1 || !seen[$0]++' | sed 's/^/   /' || true
    _disk_dir=$(mktemp -d 2>/dev/null) || _disk_dir=""
    [ -n "$_disk_dir" ] || return 0
    _disk_sampler &
    _disk_pid=$!
}

disk_phase() {
    echo "== $(date -u +%H:%M:%S) $1"
    [ -n "$_disk_dir" ] && echo "$1" >"$_disk_dir/phase" 2>/dev/null
    return 0
}

disk_finish() {
    local rc=$1 low=0 d
    set +e
    if [ -n "$_disk_pid" ]; then
        kill -TERM "$_disk_pid" 2>/dev/null
        wait "$_disk_pid"
        low=$?
    fi
    echo "== disk at the end:"
    df -h "${_disk_paths[@]}" 2>/dev/null | awk 'NR == 1 || !seen[$0]++' | sed 's/^/   /'
    echo "== du -sh of the caches:"
    local dirs=("$(_disk_pytest_root)"/pytest-* "$HOME/.cache/pip" "$HOME/.cache/uv" /var/lib/docker)
    [ -n "${DSV4PATCH_CACHE:-}" ] && dirs=("$DSV4PATCH_CACHE"/* "${dirs[@]}")
    for d in "${dirs[@]}"; do
        [ -e "$d" ] && [ -r "$d" ] && du -shx "$d" 2>/dev/null | sed 's/^/   /'
    done
    [ -n "$_disk_dir" ] && rm -rf "$_disk_dir"
    if [ "$rc" -ne 0 ] && [ "$low" -eq 3 ]; then
        echo "CI FAILED WITH THE DISK FULL: free space fell below $(_disk_human "$DISK_LOW_BYTES") (see the peaks" \
             "above); failures with 'No space left on device' (Errno 28) are that, not the code." \
             "The suite needs about 15 GB free (docs/contributing.md#disk)." >&2
    elif [ "$rc" -ne 0 ]; then
        echo "CI failed (exit $rc); free space never fell below $(_disk_human "$DISK_LOW_BYTES")." >&2
    fi
    return 0
}

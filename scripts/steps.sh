# Steps of scripts/test, each under a time limit, and how they end. Sourced: the caller sets
# `results` (a folder), `steps` (a file: one line per step, name, wall seconds, exit status)
# and the array `failed`, to which a step that fails or hangs adds itself.
# (tests/test_scripts_steps.py runs these with short steps.)

# run NAME LIMIT COMMAND...: run COMMAND under a time limit and record how it ended.
# `timeout` puts COMMAND in a process group of its own, so that a hang is killed whole; for
# the same reason a Ctrl-C (or CI's TERM) to scripts/test never reaches it. So the step runs
# in the background and is waited for (a `wait`, unlike a command in the foreground, gives way
# to a trap at once), its PID in $results/.running.NAME, and the trap below hands the signal
# on to every step still running, those beside included: nothing outlives scripts/test.
run() {
    local name=$1 limit=$2; shift 2
    printf '\n===== %s =====\n$ %s\n' "$name" "$*"
    local start=$SECONDS
    timeout --kill-after=20 "$limit" "$@" &
    local pid=$!
    echo "$pid" > "$results/.running.$name"
    wait "$pid"
    local rc=$?
    rm -f "$results/.running.$name"
    printf '%s\t%d\t%d\n' "$name" $((SECONDS - start)) $rc >> "$steps"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "[test] HUNG: '$name' did not finish within ${limit} s and was killed: $*"
        failed+=("$name (hung)")
    elif [ $rc -ne 0 ]; then
        failed+=("$name (exit $rc)")
    fi
    return $rc
}

stop_steps() {
    local file
    for file in "$results"/.running.*; do
        [ -f "$file" ] && kill -TERM "$(cat "$file")" 2>/dev/null
    done
    wait
}
trap 'echo "[test] interrupted: ending every step still running" >&2; stop_steps; exit 130' INT
trap 'echo "[test] terminated: ending every step still running" >&2; stop_steps; exit 143' TERM

# beside NAME LIMIT COMMAND...: `run` in the background, its output into NAME.log; `ended NAME`
# waits for it, shows that output and records a failure. Set-up spends minutes in one compiler
# process (mpi4py's one large C file) or on the network, with the other core idle: what the
# tests need built runs beside it. The tests wait for every such step to end, so that no timed
# test shares the machine with a build.
declare -A beside_pids
beside() {
    ( run "$@" ) > "$results/$1.log" 2>&1 &
    beside_pids[$1]=$!
}
ended() {
    wait "${beside_pids[$1]}"
    local rc=$?
    cat "$results/$1.log"
    [ $rc -eq 0 ] || failed+=("$1 (exit $rc)")
    return $rc
}

#!/usr/bin/env bash
# Soak: DURATION (default 10m) of mixed load through `idem serve` on the memory store with a
# capacity bound, in front of idem-fixture --bare. idem-load (bench/src/bin/idem-load) mixes new
# keys, replays, mismatches (same key, another body), large bodies (LARGE bytes, incompressible)
# and conflicts (a duplicate and a mismatch of a 1 s request while it runs), and samples the
# gateway's resident memory (VmRSS) every SAMPLE. Checks:
# - after the warm-up (the first WARMUP % of the run) resident memory stays within 10% of its
#   first sample (prints first, max, last and the growth);
# - every answer is the one its kind expects (201 executed or replayed, 200 for the slow
#   original, 409 for a duplicate in flight, 422 for a mismatch; a duplicate that arrives after
#   its original completed gets the replay, counted apart); no 5xx, no connection error;
# - the fixture's execution counter equals the executed (not replayed) 2xx answers.
# Exits 1 if a check fails.
#
#   bench/soak.sh
#   DURATION=2m bench/soak.sh
#   CAPACITY=50000 CONNECTIONS=64 bench/soak.sh
#   CAPACITY=1000000 MAX_BYTES=64MiB bench/soak.sh   # bounded by the byte budget instead
#
# The memory store's capacity ([store] memory_capacity) bounds the records, in flight or not;
# when it is full a new claim evicts the oldest settled record. It answers a claim with a store
# error (503) only when every record is in flight, which this load (at most CONNECTIONS +
# 3 x CONFLICT_WORKERS requests at once, far below CAPACITY) never reaches: a 503 fails the run.
# MAX_BYTES sets its byte budget ([store] memory_max_bytes; the gateway's default, 1GiB, when
# unset), which evicts the same way when the records' bytes reach it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${DURATION:-10m}
CONNECTIONS=${CONNECTIONS:-32}
CONFLICT_WORKERS=${CONFLICT_WORKERS:-4}
CAPACITY=${CAPACITY:-10000}
LARGE=${LARGE:-65536}
MAX_BYTES=${MAX_BYTES:-}
SAMPLE=${SAMPLE:-5s}
WARMUP=${WARMUP:-20}

build_release

work=$(mktemp -d)
pids=()
# shellcheck disable=SC2317 # run by the trap
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

"$fixture" --bare --listen 127.0.0.1:0 >"$work/fixture.out" 2>&1 &
upstream_pid=$!
pids+=("$upstream_pid")
upstream=$(wait_line "$work/fixture.out" "")

budget=""
if [ -n "$MAX_BYTES" ]; then budget="memory_max_bytes = \"$MAX_BYTES\""; fi
cat >"$work/idem.toml" <<TOML
[store]
url = "memory"
memory_capacity = $CAPACITY
$budget
TOML
RUST_LOG=warn "$idem" serve --config "$work/idem.toml" --upstream "http://$upstream" \
    --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$work/gateway.log" 2>&1 &
gateway=$!
pids+=("$gateway")
addr=$(wait_line "$work/gateway.log" "listening on ")
if [ "$(cat "/proc/$gateway/comm")" != idem ]; then
    echo "pid $gateway is not the gateway" >&2
    exit 2
fi

bound="capacity $CAPACITY${MAX_BYTES:+, max bytes $MAX_BYTES}"
echo "soak: $DURATION through $addr (memory store, $bound), resident memory every $SAMPLE" >&2
status=0
"$load" soak --addr "$addr" --fixture "$upstream" --pid "$gateway" --duration "$DURATION" \
    --connections "$CONNECTIONS" --conflict-workers "$CONFLICT_WORKERS" --sample "$SAMPLE" \
    --warmup "$WARMUP" --large-bytes "$LARGE" >"$work/report" || status=$?

echo
echo "idem serve on the memory store ($bound), idem-load soak -c $CONNECTIONS + $CONFLICT_WORKERS conflict workers, $DURATION, large bodies $LARGE bytes; $(nproc) cores shared, $(date -u +%Y-%m-%d)"
echo
cat "$work/report"
for p in "$upstream_pid" "$gateway"; do
    if ! kill -0 "$p" 2>/dev/null; then
        code=0
        wait "$p" || code=$?
        echo "$(cat "/proc/$p/comm" 2>/dev/null || echo "pid $p") exited during the run with status $code (a signal if over 128)"
        [ "$p" = "$gateway" ] && tail -n 5 "$work/gateway.log"
        [ "$p" = "$upstream_pid" ] && tail -n 5 "$work/fixture.out"
        status=1
    fi
done
warnings=$(grep -cE ' (WARN|ERROR) ' "$work/gateway.log" || true)
echo "gateway log: $warnings warnings or errors"
grep -m5 -E ' (WARN|ERROR) ' "$work/gateway.log" || true
exit "$status"

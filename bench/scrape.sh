#!/usr/bin/env bash
# Scrapes never touch the hot path: `idem serve` on the memory store, filled with RECORDS
# records (1,000,000 unless set), measured with wrk in rounds that alternate between no scrape
# and a `GET /metrics` every second (SCRAPE_EVERY), as Prometheus would. The request path's
# p99 with scrapes is then divided by its p99 without, in the same run, on the same store (each
# round runs both, in turns: odd rounds without scrapes first, even rounds with).
#
#   bench/scrape.sh
#   RECORDS=200000 ROUNDS=2 DURATION=10s bench/scrape.sh
#   IDEM=/path/to/another/idem bench/scrape.sh    # the same rounds on another build of idem
#
# wrk -t2 -c64, POST /echo with a new key per request (bench/http/unique-keys.lua: every
# request a first execution, a claim and a completion), in front of idem-fixture --bare. The
# fill is the same load, run until the store's records gauge reaches RECORDS; the measured
# rounds add to it. Each round with scrapes also reports how long the scrapes took.
#
# Installs wrk from Debian's packages when missing. Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS=${RECORDS:-1000000}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-64}
SCRAPE_EVERY=${SCRAPE_EVERY:-1}
IDEM=${IDEM:-}

. bench/lib.sh
install_missing wrk curl

echo "building idem-fixture and idem (release)" >&2
cargo build --release -q -p idem-fixture -p idem-gateway
target_dir=$(target_dir)
fixture="$target_dir/release/idem-fixture"
idem=${IDEM:-"$target_dir/release/idem"}

work=$(mktemp -d)
pids=()
scraper=""
cleanup() {
    if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

"$fixture" --bare --listen 127.0.0.1:0 >"$work/fixture.out" 2>&1 &
pids+=($!)
upstream=$(wait_line "$work/fixture.out" "")

# Room for every record the fill and the rounds write: nothing is evicted.
cat >"$work/idem.toml" <<EOF
[store]
memory_capacity = $((RECORDS * 3))
memory_max_bytes = "16GiB"
EOF
admin_port=$(free_port)
RUST_LOG=warn "$idem" serve --config "$work/idem.toml" --upstream "http://$upstream" \
    --listen 127.0.0.1:0 --admin-listen "127.0.0.1:$admin_port" --store memory >"$work/idem.out" 2>&1 &
pids+=($!)
addr=$(wait_line "$work/idem.out" "listening on ")
metrics="http://127.0.0.1:$admin_port/metrics"

# gauge <name>: the value of an unlabelled series of /metrics, as an integer.
gauge() {
    curl -fsS "$metrics" | awk -v name="$1" '$1 == name { printf "%d", $2 }'
}

echo "filling the store to $RECORDS records" >&2
while [ "$(gauge idem_gateway_store_records)" -lt "$RECORDS" ]; do
    wrk -t"$THREADS" -c"$CONNECTIONS" -d10s -s bench/http/unique-keys.lua "http://$addr" >/dev/null
    echo "  $(gauge idem_gateway_store_records) records" >&2
done

# scrape_loop <file>: scrapes /metrics every SCRAPE_EVERY seconds, appending each scrape's
# time in seconds to <file>.
scrape_loop() {
    while :; do
        curl -fsS -o /dev/null -w '%{time_total}\n' "$metrics" >>"$1" || true
        sleep "$SCRAPE_EVERY"
    done
}

# to_ms <wrk latency>: milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
        printf "%.2f", n }'
}

rows=()
declare -A p99_sum rps_sum
p99_sum[off]=0 p99_sum[on]=0 rps_sum[off]=0 rps_sum[on]=0
for round in $(seq "$ROUNDS"); do
    # Odd rounds run without scrapes first, even rounds with: whatever drifts over the run
    # (the store grows, the machine's other work comes and goes) falls on both.
    modes="off on"
    [ $((round % 2)) -eq 0 ] && modes="on off"
    for mode in $modes; do
        scrape_times="$work/scrapes-$round"
        : >"$scrape_times"
        if [ "$mode" = on ]; then
            scrape_loop "$scrape_times" &
            scraper=$!
        fi
        echo "round $round, scrapes $mode" >&2
        out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s bench/http/unique-keys.lua "http://$addr")
        if [ -n "$scraper" ]; then
            kill "$scraper" 2>/dev/null || true
            wait "$scraper" 2>/dev/null || true
            scraper=""
        fi
        rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
        p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
        p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
        scrapes="-"
        if [ "$mode" = on ]; then
            scrapes=$(awk '{ n++; s += $1; if ($1 > m) m = $1 } END { if (n) printf "%d, mean %.1f ms, max %.1f ms", n, s * 1000 / n, m * 1000 }' "$scrape_times")
        fi
        rows+=("| $round | $mode | $rps | $p50 | $p99 | $scrapes |")
        p99_sum[$mode]=$(awk -v a="${p99_sum[$mode]}" -v b="$p99" 'BEGIN { print a + b }')
        rps_sum[$mode]=$(awk -v a="${rps_sum[$mode]}" -v b="$rps" 'BEGIN { print a + b }')
    done
done
records=$(gauge idem_gateway_store_records)

echo
echo "idem serve on the memory store holding $RECORDS records at the start ($records at the end), wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency, POST /echo with a new key per request, scrapes of /metrics every ${SCRAPE_EVERY}s in the rounds marked on, $(nproc) cores shared by wrk, idem and the upstream, $(date -u +%Y-%m-%d)"
echo
echo "| round | scrapes | req/s | p50 ms | p99 ms | scrapes made, their time |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
awk -v on="${p99_sum[on]}" -v off="${p99_sum[off]}" -v ron="${rps_sum[on]}" -v roff="${rps_sum[off]}" 'BEGIN {
    printf "p99 with scrapes / without (mean of the rounds): %.2f; req/s with / without: %.2f\n", on / off, ron / roff }'

#!/usr/bin/env bash
# The Redis server's CPU per operation of the Redis store, next to plain commands that do the
# least the same work needs, driven by the same client at the same concurrency, on the same
# server, in one run (idem-store-redis/examples/claim_complete, one --mode each):
#   - cycle:  a first execution, claim + complete (a 100-byte result);
#   - plain:  SET NX then SET of values as long as the store's in-flight and completed records;
#   - replay: a claim of a completed key, answered with its record;
#   - get:    a GET of a value as long as the completed record.
# The server's CPU is used_cpu_user + used_cpu_sys from INFO cpu, read before and after each
# run, divided by the operations of the run (INFO commandstats would count a script's inner
# commands twice). Each figure is the lowest of REPEAT runs; the runs of the four modes
# alternate, so a change in the machine's load hits every side alike. The aims (issue 22): a
# first execution at most 2x its plain SET NX + SET, a replay at most 1.5x its plain GET.
#
#   bench/redis.sh                   # a redis-server of its own on a free port, 5 s per run
#   SECONDS_PER_RUN=10 TASKS="16" bench/redis.sh
#   REDIS_URL=redis://127.0.0.1:6379 bench/redis.sh   # an existing server instead (it is not flushed)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
TASKS=${TASKS:-"1 16 64"}
REPEAT=${REPEAT:-3}

. bench/lib.sh
install_missing redis-server:redis-server redis-cli:redis-tools
trap stop_private_redis EXIT
private_redis
[ -n "${REDIS_URL:-}" ] || { echo "no REDIS_URL and no redis-server to start" >&2; exit 1; }
hostport=${REDIS_URL#redis://}
hostport=${hostport%%/*}
host=${hostport%:*}
port=${hostport##*:}

echo "building the claim_complete example (release)" >&2
cargo build --release -q -p idem-store-redis --example claim_complete
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bench="$target_dir/release/examples/claim_complete"

server_version=$(redis-cli -h "$host" -p "$port" info server | sed -n 's/^redis_version:\(.*\)\r$/\1/p')
echo "server: redis $server_version at $host:$port; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); ${SECONDS_PER_RUN}s per run, best of $REPEAT"
# The server's CPU seconds so far (user + system).
server_cpu() {
    redis-cli -h "$host" -p "$port" info cpu | tr -d '\r' \
        | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}
# One run of `mode` at `tasks`: "ops/s us-of-server-cpu-per-op value-bytes".
run() {
    local mode=$1 tasks=$2 before after line
    before=$(server_cpu)
    line=$("$bench" --url "$REDIS_URL" --tasks "$tasks" --seconds "$SECONDS_PER_RUN" --mode "$mode")
    after=$(server_cpu)
    echo "$line" | awk -v b="$before" -v a="$after" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "%s %.2f %s/%s\n", v["cycles_per_sec"], (a - b) * 1e6 / (v["cycles"] + v["warmup_cycles"]), v["in_flight_bytes"], v["completed_bytes"]
    }'
}
min() { sort -g | head -n 1; }
max() { sort -g | tail -n 1; }
printf '%-6s %-26s %10s %14s %16s %9s\n' tasks operation "ops/s" "us cpu/op" "baseline us/op" "cpu ratio"
for tasks in $TASKS; do
    results=$(for _ in $(seq "$REPEAT"); do
        for mode in cycle plain replay get; do
            echo "$mode $(run "$mode" "$tasks")"
        done
    done)
    best() { echo "$results" | awk -v m="$1" -v f="$2" '$1 == m { print $f }'; }
    for pair in "cycle plain" "replay get"; do
        set -- $pair
        rate=$(best "$1" 2 | max)
        cpu=$(best "$1" 3 | min)
        base_rate=$(best "$2" 2 | max)
        base_cpu=$(best "$2" 3 | min)
        sizes=$(best "$1" 4 | head -n 1)
        case $1 in
            cycle) what="claim+complete"; base="SET NX+SET ($sizes B)" ;;
            replay) what="replay (claim)"; base="GET (${sizes#*/} B)" ;;
        esac
        awk -v t="$tasks" -v w="$what" -v b="$base" -v r="$rate" -v c="$cpu" -v br="$base_rate" -v bc="$base_cpu" 'BEGIN {
            printf "%-6s %-26s %10.0f %14.2f %16s %9s\n", t, w, r, c, "", ""
            printf "%-6s %-26s %10.0f %14s %16.2f %9.2f\n", t, "  " b, br, "", bc, c / bc
        }'
    done
done

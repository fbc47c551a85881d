#!/usr/bin/env bash
# The Redis store's throughput against the server's own ceiling, on the same machine and the
# same server, in one run:
#   - claim + complete cycles per second of RedisStore (idem-store-redis/examples/claim_complete)
#     at 1, 16 and 64 concurrent tasks sharing one store (one multiplexed connection);
#   - redis-benchmark running EVALSHA of a trivial one-key script with 1, 16 and 64 clients.
# One cycle is two scripts (claim, complete), so half the EVALSHA rate is the ceiling; the
# script prints cycles/s, the ceiling, and the ratio to it (best rate against best rate, and
# the lowest and highest ratio of one store run to the baseline run right after it). It also
# prints the server's CPU time per operation (from INFO cpu): per cycle for the store, per
# EVALSHA for the baseline.
# On a machine shared with other work the rates are noisy; the CPU figures much less so, and
# "cpu ratio" (two baseline EVALSHAs / one cycle, in server CPU) is the ratio a server-bound
# run would reach.
#
#   bench/redis.sh                   # a redis-server of its own on a free port, 5 s per run
#   SECONDS_PER_RUN=10 bench/redis.sh
#   REDIS_URL=redis://127.0.0.1:6379 bench/redis.sh   # an existing server instead (it is not flushed)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
TASKS=${TASKS:-"1 16 64"}
# Each figure is the best of this many runs (a shared machine is noisy; both sides alike).
REPEAT=${REPEAT:-3}

. bench/lib.sh
install_missing redis-server:redis-server redis-cli:redis-tools redis-benchmark:redis-tools
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

sha=$(redis-cli -h "$host" -p "$port" script load "return redis.call('EXISTS', KEYS[1])")
server_version=$(redis-cli -h "$host" -p "$port" info server | sed -n 's/^redis_version:\(.*\)\r$/\1/p')
echo "server: redis $server_version at $host:$port; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); ${SECONDS_PER_RUN}s per run, best of $REPEAT"
printf '%-6s %10s %11s %9s %7s %11s %13s %15s %10s\n' tasks "cycles/s" "EVALSHA/s" ceiling ratio \
    "pair ratios" "us/cycle cpu" "us/EVALSHA cpu" "cpu ratio"
max() { sort -g | tail -n 1; }
min() { sort -g | head -n 1; }
# The server's CPU seconds so far (user + system).
server_cpu() {
    redis-cli -h "$host" -p "$port" info cpu | tr -d '\r' \
        | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}
# One store run and one baseline run after the other, REPEAT times: a change in the machine's
# load then hits both sides of a pair alike. The best rate of each side gives "ratio"; the
# ratio of each pair on its own gives "pair ratios" (lowest-highest), the spread to expect.
for tasks in $TASKS; do
    pairs=$(for _ in $(seq "$REPEAT"); do
        before=$(server_cpu)
        line=$("$bench" --url "$REDIS_URL" --tasks "$tasks" --seconds "$SECONDS_PER_RUN")
        after=$(server_cpu)
        store=$(echo "$line" | awk -v b="$before" -v a="$after" '{
            for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            printf "%s %.2f\n", v["cycles_per_sec"], (a - b) * 1e6 / (v["cycles"] + v["warmup_cycles"])
        }')
        # As many EVALSHA requests as it does in about the same time.
        requests=$(echo "$store" | awk -v s="$SECONDS_PER_RUN" '{ n = $1 * 2 * s * 3; if (n < 20000) n = 20000; printf "%d", n }')
        before=$(server_cpu)
        rps=$(redis-benchmark -h "$host" -p "$port" -c "$tasks" -n "$requests" -r 100000 -q \
                EVALSHA "$sha" 1 "bench:key:__rand_int__" \
            | tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
        after=$(server_cpu)
        awk -v s="$store" -v r="$rps" -v b="$before" -v a="$after" -v n="$requests" \
            'BEGIN { split(s, st, " "); printf "%s %s %s %.2f %.3f\n", st[1], st[2], r, (a - b) * 1e6 / n, st[1] / (r / 2) }'
    done)
    cycles=$(echo "$pairs" | cut -d' ' -f1 | max)
    cycle_cpu=$(echo "$pairs" | cut -d' ' -f2 | min)
    evalsha=$(echo "$pairs" | cut -d' ' -f3 | max)
    evalsha_cpu=$(echo "$pairs" | cut -d' ' -f4 | min)
    low=$(echo "$pairs" | cut -d' ' -f5 | min)
    high=$(echo "$pairs" | cut -d' ' -f5 | max)
    awk -v t="$tasks" -v c="$cycles" -v e="$evalsha" -v cc="$cycle_cpu" -v ec="$evalsha_cpu" \
        -v lo="$low" -v hi="$high" 'BEGIN {
        ceiling = e / 2
        printf "%-6s %10.0f %11.0f %9.0f %7.2f %6.2f-%4.2f %13.1f %15.1f %10.2f\n", t, c, e, ceiling, c / ceiling, lo, hi, cc, ec, 2 * ec / cc
    }'
done

#!/usr/bin/env bash
# The HTTP layer against the same app without it, driven by two clients: wrk -t2 -c64 for 10 s
# (a keep-alive client with the kernel's delayed ACKs, as real clients are) and idem-load rate
# (hyper's pooled client, TCP_NODELAY, 64 connections), against idem-fixture with the layer
# (memory store; Redis, PostgreSQL and redb when the fixture has them) and with --bare, for
# first executions (a unique key per request, bench/http/unique-keys.lua) and replays (one key,
# bench/http/replay.lua). Prints requests per second and the ratio to --bare for each client,
# flags a target whose two clients differ by more than 20%, and for Redis the commands per
# request from INFO commandstats. The CPU columns are the fixture's own CPU time per request
# under wrk, with the ratio bare/layer in parentheses (1.00 = no overhead); the last lines give
# the difference, the CPU the layer adds to each request. A row for `--floor`, a minimal
# stand-in for the layer, shows how much of that any idempotency layer pays; on Redis, `--floor
# --store redis://` does the same with its records in Redis (the least a Redis-backed layer
# sends), and the Redis server's own CPU per request (INFO cpu) stands beside each Redis row.
# For PostgreSQL and redb, the floor is the store's own claim + complete cycles per second at
# 64 tasks next to a plain INSERT + UPDATE (redb: two durable write transactions), measured in
# the same run with the examples bench/stores.sh runs: no layer can execute more requests per
# second than its store completes cycles.
#
#   bench/http.sh                 # memory store, and Redis/PostgreSQL/redb where reachable
#   DURATION=30s bench/http.sh    # longer runs
#   STEADY=100000 bench/http.sh   # the bound of the steady-size memory store row (default 20000)
#   REDIS_URL=redis://127.0.0.1:6379 bench/http.sh   # use that server instead of a private one
#   POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test bench/http.sh   # the default
#   STORES="memory redis" bench/http.sh               # only those stores
#
# Redis: unless REDIS_URL is set, the script starts a private redis-server on a free port (no
# persistence) and stops it at the end, so the command counts see only this benchmark's traffic.
# "Round trips per request" counts the commands the store sends (SET NX GET for a claim, EVALSHA
# of the compare-and-set for a complete); the GET and SET the script runs inside the server are
# counted apart. PostgreSQL: the run works in a schema of its own, dropped at the end; redb in a
# file under a temporary folder.
#
# Prerequisites: wrk (installed from Debian's packages when missing), and the release builds
# of idem-fixture and idem-load, which the script makes.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-64}
REDIS_URL=${REDIS_URL:-}
POSTGRES_URL=${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
STORES=${STORES:-"memory redis postgres redb"}

. bench/lib.sh
install_missing wrk

echo "building idem-fixture and idem-load (release)" >&2
cargo build --release -q -p idem-fixture -p idem-bench --bin idem-load
target_dir=$(target_dir)
fixture="$target_dir/release/idem-fixture"
idem_load="$target_dir/release/idem-load"
work=$(mktemp -d)
schema="idem_bench_http_$$"

pid=""
cleanup() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; }
drop_schema() { psql "$POSTGRES_URL" -qc "drop schema if exists $schema cascade" >/dev/null 2>&1 || true; }
trap 'cleanup; stop_private_redis; drop_schema; rm -rf "$work"' EXIT
has() { [[ " $STORES " == *" $1 "* ]]; }

private_redis
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}

# start <args...>: starts the fixture, sets $pid and $addr.
start() {
    local out
    out=$(mktemp)
    "$fixture" --listen 127.0.0.1:0 --retention-ms 600000 "$@" >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 50); do
        addr=$(head -n 1 "$out")
        if [[ $addr == 127.0.0.1:* ]]; then rm -f "$out"; return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then cat "$out" >&2; rm -f "$out"; pid=""; return 1; fi
        sleep 0.1
    done
    rm -f "$out"
    return 1
}

# cpu_ticks: CPU time (user + system, in clock ticks) the fixture has used so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

# measure <script>: runs wrk against $addr; prints "<requests per second> <server CPU us per request>".
# The CPU time per request is steadier than throughput on a machine shared with other work.
measure() {
    local before after out
    before=$(cpu_ticks)
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "bench/http/$1" "http://$addr")
    after=$(cpu_ticks)
    awk -v ticks=$((after - before)) -v hz="$hz" '
        /requests in/ { n = $1 }
        /^Requests\/sec:/ { rps = $2 }
        END { printf "%s %.1f", rps, ticks * 1000000 / hz / n }' <<<"$out"
}

# calls <pattern>: Redis calls so far of the commands whose INFO commandstats name matches.
calls() {
    redis-cli -u "$REDIS_URL" info commandstats \
        | awk -F'[:=,]' -v re="$1" '$1 ~ /^cmdstat_/ { name = substr($1, 9); if (name ~ re) sum += $3 } END { print sum + 0 }'
}

# redis_cpu: the Redis server's CPU seconds so far (used_cpu_user + used_cpu_sys).
redis_cpu() {
    redis-cli -u "$REDIS_URL" info cpu | tr -d '\r' \
        | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}

declare -A result
run_case() { # run_case <name> <script> <fixture args...>
    local name=$1 script=$2 before
    shift 2
    start "$@" || return 1
    # Warm up the connections and the allocator.
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s "bench/http/$script" "http://$addr" >/dev/null
    # Runs on Redis also take the Redis server's CPU per request (it shares the cores).
    case $name in redis_*) before=$(redis_cpu) ;; esac
    read -r result[$name] result[${name}_cpu] <<<"$(measure "$script")"
    case $name in redis_*)
        result[${name}_server]=$(awk -v b="$before" -v a="$(redis_cpu)" -v rps="${result[$name]}" \
            -v d="${DURATION%s}" 'BEGIN { printf "%.1f", (a - b) * 1e6 / (rps * d) }') ;;
    esac
    read -r result[${name}_load] result[${name}_load_p99] \
        <<<"$(load_rate "$idem_load" "$addr" "$script" "$CONNECTIONS" "$DURATION")"
    cleanup
    pid=""
}

run_case bare_unique unique-keys.lua --bare
run_case bare_replay replay.lua --bare
# The floor: a minimal stand-in for the layer (idem-fixture --floor: key, body, SHA-256, one
# Mutex<HashMap> of responses, nothing else; see idem-fixture/src/floor.rs). What it costs, any
# idempotency layer costs; its ratio to --bare bounds the ratio a layer can reach on this host.
run_case floor_unique unique-keys.lua --floor
run_case floor_replay replay.lua --floor
run_case memory_unique unique-keys.lua --store memory
run_case memory_replay replay.lua --store memory
# The memory store at its steady size: bounded to STEADY records, which the warm-up fills, so
# every measured claim evicts the oldest settled record instead of growing the store, as a store
# with a retention stops growing in a long-lived process. Set beside the unbounded store, which
# grows by hundreds of thousands of records in a run, it tells whether that growth is part of
# what a first execution costs here (on 2026-12-02 it was not: 0.63 against 0.66 of --bare).
STEADY=${STEADY:-20000}
run_case steady_unique unique-keys.lua --store memory --memory-capacity "$STEADY"
run_case steady_replay replay.lua --store memory --memory-capacity "$STEADY"

redis=false
if has redis && redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && start --store "$REDIS_URL" 2>/dev/null; then
    cleanup; pid=""; redis=true
    run_case redis_unique unique-keys.lua --store "$REDIS_URL"
    run_case redis_replay replay.lua --store "$REDIS_URL"
    # The floor on Redis: --floor with its records in Redis, the least any Redis-backed layer
    # sends (SET NX GET to claim, a plain SET to complete; one SET NX GET for a replay).
    run_case redis_floor_unique unique-keys.lua --floor --store "$REDIS_URL"
    run_case redis_floor_replay replay.lua --floor --store "$REDIS_URL"
    # Round trips (the commands the store sends: SET, GET, DEL, EVALSHA) and the commands the
    # compare-and-set script runs inside the server (one GET and one SET per EVALSHA, which
    # INFO commandstats counts under get and set too), per request.
    for kind in unique replay conflict; do
        start --store "$REDIS_URL"
        case $kind in
            unique) script=unique-keys.lua ;;
            replay) script=replay.lua ;;
            conflict) script=conflict.lua ;;
        esac
        wrk -t1 -c1 -d1s -s "bench/http/$script" "http://$addr" >/dev/null # warm: the replay key exists
        scripts=$(calls '^evalsha$')
        commands=$(calls '^(set|get|del|evalsha)$')
        sent=$(wrk -t1 -c4 -d3s -s "bench/http/$script" "http://$addr" | awk '/requests in/ { print $1 }')
        scripts=$(($(calls '^evalsha$') - scripts))
        commands=$(($(calls '^(set|get|del|evalsha)$') - commands))
        inside=$((2 * scripts))
        trips=$((commands - inside))
        result[redis_${kind}_trips]=$(awk -v c="$trips" -v n="$sent" 'BEGIN { printf "%.2f", c / n }')
        result[redis_${kind}_inside]=$(awk -v c="$inside" -v n="$sent" 'BEGIN { printf "%.1f", c / n }')
        cleanup
        pid=""
    done
fi

# The durable stores: the layer on each, and the store's own floor at 64 tasks (claim +
# complete cycles of the store, and the plain INSERT + UPDATE / two redb write transactions
# beside it), from the examples bench/stores.sh runs.
postgres=false
if has postgres && psql "$POSTGRES_URL" -qAtc 'select 1' >/dev/null 2>&1 \
    && start --store "$POSTGRES_URL" --namespace "$schema" 2>/dev/null; then
    cleanup; pid=""; postgres=true
    run_case postgres_unique unique-keys.lua --store "$POSTGRES_URL" --namespace "$schema"
    run_case postgres_replay replay.lua --store "$POSTGRES_URL" --namespace "$schema"
fi
redb=false
if has redb && start --store "redb:$work/bench.redb" 2>/dev/null; then
    cleanup; pid=""; redb=true
    run_case redb_unique unique-keys.lua --store "redb:$work/bench.redb"
    run_case redb_replay replay.lua --store "redb:$work/bench.redb"
fi
if $postgres || $redb; then
    echo "building the store examples (release)" >&2
    $postgres && cargo build --release -q -p idem-store-postgres --example postgres_claim_complete
    $redb && cargo build --release -q -p idem-store-redb --example redb_claim_complete
fi
floor_runs() { # floor_runs <example> <env...>: its output, 64 tasks, 5 s a column
    env TASKS=64 SECONDS_PER_RUN=5 SLICES=1 "${@:2}" "$target_dir/release/examples/$1" 2>&1
}
$postgres && result[postgres_floor]=$(floor_runs postgres_claim_complete IDEM_BENCH_POSTGRES_URL="$POSTGRES_URL")
$redb && result[redb_floor]=$(floor_runs redb_claim_complete IDEM_BENCH_DIR="$work")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION, POST /echo (32-byte JSON body), $(nproc) cores, $(date -u +%Y-%m-%d)"
echo
echo "| run | first executions (req/s) | ratio to --bare | server CPU per request | replays (req/s) | ratio to --bare | server CPU per request |"
echo "|---|---|---|---|---|---|---|"
row() { # row <label> <prefix>
    echo "| $1 | ${result[${2}_unique]} | $(ratio "${result[${2}_unique]}" "${result[bare_unique]}") | ${result[${2}_unique_cpu]} us ($(ratio "${result[bare_unique_cpu]}" "${result[${2}_unique_cpu]}")) | ${result[${2}_replay]} | $(ratio "${result[${2}_replay]}" "${result[bare_replay]}") | ${result[${2}_replay_cpu]} us ($(ratio "${result[bare_replay_cpu]}" "${result[${2}_replay_cpu]}")) |"
}
row "--bare" bare
row "floor (--floor: the least any layer does)" floor
row "layer, memory store" memory
row "layer, memory store at its steady size ($STEADY records, every claim evicts)" steady
# added <prefix> <kind>: the fixture's CPU per request with the layer minus without it, in us.
added() { awk -v a="${result[${1}_${2}_cpu]}" -v b="${result[bare_${2}_cpu]}" 'BEGIN { printf "%.1f", a - b }'; }
$postgres && row "layer, PostgreSQL store" postgres
$redb && row "layer, redb store" redb
if $redis; then
    row "floor on Redis (--floor --store redis://: the least a Redis-backed layer does)" redis_floor
    row "layer, Redis store" redis
    echo
    echo "Redis server CPU per request (INFO cpu, the same runs): floor on Redis ${result[redis_floor_unique_server]} us per first execution, ${result[redis_floor_replay_server]} us per replay; layer ${result[redis_unique_server]} us and ${result[redis_replay_server]} us"
    echo "fixture CPU the layer on Redis adds over the floor on Redis: $(awk -v a="${result[redis_unique_cpu]}" -v b="${result[redis_floor_unique_cpu]}" 'BEGIN { printf "%.1f", a - b }') us per first execution, $(awk -v a="${result[redis_replay_cpu]}" -v b="${result[redis_floor_replay_cpu]}" 'BEGIN { printf "%.1f", a - b }') us per replay; the floor's two round trips add $(awk -v a="${result[redis_floor_unique_cpu]}" -v b="${result[floor_unique_cpu]}" 'BEGIN { printf "%.1f", a - b }') us per first execution over the floor in memory"
    echo
    echo "Redis round trips (commands sent) per request: first execution ${result[redis_unique_trips]}, replay ${result[redis_replay_trips]}, conflict ${result[redis_conflict_trips]}"
    echo "(commands the compare-and-set script runs inside the server, per request: ${result[redis_unique_inside]}, ${result[redis_replay_inside]} and ${result[redis_conflict_inside]})"
else
    echo
    echo "(Redis not measured: no server at $REDIS_URL, or this idem-fixture has no Redis store)"
fi
echo
echo "CPU the layer adds per request (layer minus --bare): memory store $(added memory unique) us per first execution ($(added steady unique) us at its steady size), $(added memory replay) us per replay$($redis && echo "; Redis store $(added redis unique) us and $(added redis replay) us")"
echo "CPU the floor adds per request (--floor minus --bare): $(added floor unique) us per first execution, $(added floor replay) us per replay"
over_floor() { awk -v a="${result[memory_${1}_cpu]}" -v b="${result[floor_${1}_cpu]}" 'BEGIN { printf "%.1f", a - b }'; }
echo "CPU idem-http's machinery adds over the floor (memory store minus --floor): $(over_floor unique) us per first execution, $(over_floor replay) us per replay"

# The second client: idem-load rate against the same targets, right after wrk's run on each.
cases=(bare floor memory steady)
$redis && cases+=(redis_floor redis)
$postgres && cases+=(postgres)
$redb && cases+=(redb)
echo
echo "idem-load rate (hyper's pooled client, TCP_NODELAY, $CONNECTIONS connections, $DURATION), the same targets; wrk/idem-load is the ratio of the two clients' req/s:"
echo
echo "| run | first executions (req/s) | ratio to --bare | p99 ms | wrk/idem-load | replays (req/s) | ratio to --bare | p99 ms | wrk/idem-load |"
echo "|---|---|---|---|---|---|---|---|---|"
apart=()
for c in "${cases[@]}"; do
    line="| $c"
    for k in unique replay; do
        n=${c}_$k
        both=$(ratio "${result[$n]}" "${result[${n}_load]}")
        line+=" | ${result[${n}_load]} | $(ratio "${result[${n}_load]}" "${result[bare_${k}_load]}") | ${result[${n}_load_p99]} | $both"
        if clients_apart "${result[$n]}" "${result[${n}_load]}"; then
            apart+=("$n: wrk ${result[$n]}, idem-load ${result[${n}_load]} req/s ($both)")
        fi
    done
    echo "$line |"
done
report_apart "${apart[@]}"
if $postgres; then
    echo
    echo "PostgreSQL floor, the same run (postgres_claim_complete at 64 tasks: claim + complete cycles/s of the store, its SQL by hand, a wide and a plain INSERT + UPDATE):"
    sed 's/^/  /' <<<"${result[postgres_floor]}"
fi
if $redb; then
    echo
    echo "redb floor, the same run (redb_claim_complete at 64 tasks: claim + complete cycles/s of the store, and plain redb insert + update):"
    sed 's/^/  /' <<<"${result[redb_floor]}"
fi

#!/usr/bin/env bash
# The idem gateway against nginx, in front of the same upstream (idem-fixture --bare), in one
# run: the upstream direct, nginx proxy_pass (keep-alive pool), `idem serve` on the memory store
# and on Redis, `idem serve` with idempotency off (the proxy alone), and on a full memory store
# (a capacity of 20,000 that the warm-up fills, so every claim evicts), and three rows that say
# what the aims are measured against: a minimal hyper proxy (bench/examples/hyper_proxy.rs, the
# floor of any proxy built on hyper), and the upstream itself with idem-http's layer in process
# (`idem-fixture --store memory`, as bench/http.sh runs it) and with `--floor` (the least any
# idempotency layer adds). wrk -t2 -c64 for 10 s,
# POST /echo with a unique Idempotency-Key per request (bench/http/unique-keys.lua: every
# request a first execution) and with one key (bench/http/replay.lua: every request after the
# first a replay). Prints requests per second and p99 latency, with their ratios to nginx, as a
# markdown table; the same for a second client, idem-load rate (hyper's pooled client with
# TCP_NODELAY, 64 connections), run on each target right after wrk, with the targets whose two
# clients differ by more than 20% named; then the CPU time each proxy spends per request (user + system from /proc,
# unique keys): steadier than throughput on a machine shared with other work, and the budget
# the ratios come down to, since wrk, the proxy and the upstream share the cores.
#
#   bench/gateway.sh
#   DURATION=30s bench/gateway.sh
#   REDIS_URL=redis://127.0.0.1:6379 bench/gateway.sh   # that server instead of a private one
#
# Redis: unless REDIS_URL is set, the script starts a private redis-server on a free port (no
# persistence) and stops it at the end: the unique-key runs write about a million records,
# which must not land in a server that tests share.
#
# Installs wrk and nginx from Debian's packages when missing. Everything listens on 127.0.0.1.
# The gateways run with their admin listener, so metrics are recorded as in production.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-64}
REDIS_URL=${REDIS_URL:-}

. bench/lib.sh
install_missing wrk nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

echo "building idem-fixture and idem (release, with the redis store)" >&2
cargo build --release -q -p idem-fixture -p idem-gateway --features idem-gateway/redis
cargo build --release -q -p idem-bench --example hyper_proxy --bin idem-load
target_dir=$(target_dir)
fixture="$target_dir/release/idem-fixture"
idem="$target_dir/release/idem"
hyper_proxy="$target_dir/release/examples/hyper_proxy"
idem_load="$target_dir/release/idem-load"

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -f "$work/nginx.pid" ]; then kill "$(cat "$work/nginx.pid")" 2>/dev/null || true; fi
    rm -rf "$work"
    stop_private_redis
}
trap cleanup EXIT
private_redis

# The upstream.
"$fixture" --bare --listen 127.0.0.1:0 >"$work/fixture.out" 2>&1 &
pids+=($!)
upstream=$(wait_line "$work/fixture.out" "")

# nginx, as a reverse proxy with a keep-alive pool to the upstream (what idem does too).
nginx_port=$(free_port)
nginx_conf "$work" "$upstream" "$nginx_port" "worker_processes 2; daemon on;"
"$NGINX" -c "$work/nginx.conf" -p "$work/nginx" -e "$work/nginx/error.log"
nginx_addr="127.0.0.1:$nginx_port"

# idem serve: start_idem <name> <store> [more flags]; sets the address in addr_<name> and the
# process in pid_<name>.
start_idem() {
    local name=$1 store=$2
    shift 2
    RUST_LOG=warn "$idem" serve --upstream "http://$upstream" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
        --store "$store" "$@" >"$work/$name.out" 2>&1 &
    pids+=($!)
    printf -v "pid_$name" '%s' "$!"
    printf -v "addr_$name" '%s' "$(wait_line "$work/$name.out" "listening on ")"
}
start_idem memory memory
# The proxy alone: every request through a route with `enabled = false`.
printf '[idempotency]\nenabled = false\n' >"$work/plain.toml"
start_idem plain memory --config "$work/plain.toml"
# The memory store full: a capacity the warm-up run fills, so every measured claim evicts.
printf '[store]\nmemory_capacity = 20000\n' >"$work/full.toml"
start_idem full memory --config "$work/full.toml"
# The floor of a proxy on hyper: one upstream connection per client connection, nothing else.
"$hyper_proxy" 127.0.0.1:0 "$upstream" >"$work/hyper.out" 2>&1 &
pids+=($!)
pid_hyper=$!
addr_hyper=$(wait_line "$work/hyper.out" "listening on ")
# The layer in process: the upstream with idem-http's layer on the memory store, and with
# --floor (key, body, SHA-256, one Mutex<HashMap> of responses), measured as the upstream is.
start_fixture() { # start_fixture <name> <flags...>
    local name=$1
    shift
    "$fixture" --listen 127.0.0.1:0 --retention-ms 600000 "$@" >"$work/$name.out" 2>&1 &
    pids+=($!)
    printf -v "pid_$name" '%s' "$!"
    printf -v "addr_$name" '%s' "$(wait_line "$work/$name.out" "")"
}
start_fixture layer --store memory
start_fixture floor --floor
redis=false
if [ -n "$REDIS_URL" ] && redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
    start_idem redis "$REDIS_URL"
    # --floor with its records in Redis: the least any Redis-backed layer sends.
    start_fixture redis_floor --floor --store "$REDIS_URL"
    redis=true
fi

# to_ms <wrk latency>: milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
        printf "%.2f", n }'
}

# cpu_ticks <pid>...: CPU time (user + system, in clock ticks) the processes have used so far.
cpu_ticks() {
    local pid sum=0
    for pid in "$@"; do sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat"))); done
    echo "$sum"
}
hz=$(getconf CLK_TCK)

# measure <addr> <script> <pid>...: "<requests per second> <p99 ms> <non-2xx> <CPU us of the
# processes per request>".
measure() {
    local addr=$1 script=$2
    shift 2
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s "bench/http/$script" "http://$addr" >/dev/null
    local out rps p99 errors before after
    before=$(cpu_ticks "$@")
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "bench/http/$script" "http://$addr")
    after=$(cpu_ticks "$@")
    rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    errors=$(awk '/Non-2xx or 3xx responses:/ { print $5 }' <<<"$out")
    cpu=$(awk -v ticks=$((after - before)) -v hz="$hz" '/requests in/ { printf "%.1f", ticks * 1000000 / hz / $1 }' <<<"$out")
    echo "$rps $(to_ms "$p99") ${errors:-0} $cpu"
}

declare -A rps p99 errs cpu lrps lp99
targets=(direct nginx hyper plain memory full layer floor)
addr_direct=$upstream
addr_nginx=$nginx_addr
pid_direct=${pids[0]}
# nginx's CPU is its workers'.
pid_nginx=$(pgrep -d ' ' -P "$(cat "$work/nginx.pid")")
$redis && targets+=(redis redis_floor)
for target in "${targets[@]}"; do
    addr_var="addr_$target"
    pid_var="pid_$target"
    for script in unique-keys.lua replay.lua; do
        echo "measuring $target with $script" >&2
        # shellcheck disable=SC2086 # pid_nginx holds one pid per worker
        read -r r p e c <<<"$(measure "${!addr_var}" "$script" ${!pid_var})"
        rps[$target,$script]=$r
        p99[$target,$script]=$p
        errs[$target,$script]=$e
        cpu[$target,$script]=$c
        read -r r p <<<"$(load_rate "$idem_load" "${!addr_var}" "$script" "$CONNECTIONS" "$DURATION")"
        lrps[$target,$script]=$r
        lp99[$target,$script]=$p
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
label() {
    case $1 in
    direct) echo "upstream direct" ;;
    nginx) echo "nginx proxy_pass" ;;
    plain) echo "idem serve, idempotency off (the proxy alone)" ;;
    memory) echo "idem serve, memory store" ;;
    full) echo "idem serve, memory store full (capacity 20,000: every claim evicts)" ;;
    redis) echo "idem serve, Redis store" ;;
    hyper) echo "floor: a minimal hyper proxy (no idem code)" ;;
    layer) echo "upstream with idem-http's layer in process (memory store, as bench/http.sh)" ;;
    floor) echo "upstream with --floor (the least an idempotency layer adds)" ;;
    redis_floor) echo "upstream with --floor on Redis (the least a Redis-backed layer adds)" ;;
    esac
}

echo
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency, POST /echo (32-byte JSON body) to idem-fixture --bare, $(nproc) cores shared by wrk, the proxy and the upstream, $(date -u +%Y-%m-%d)"
echo
echo "| target | unique keys: req/s | x nginx | p99 ms | x nginx | replays: req/s | x nginx | p99 ms | x nginx |"
echo "|---|---|---|---|---|---|---|---|---|"
for target in "${targets[@]}"; do
    u=unique-keys.lua
    r=replay.lua
    echo "| $(label "$target") | ${rps[$target,$u]} | $(ratio "${rps[$target,$u]}" "${rps[nginx,$u]}") | ${p99[$target,$u]} | $(ratio "${p99[$target,$u]}" "${p99[nginx,$u]}") | ${rps[$target,$r]} | $(ratio "${rps[$target,$r]}" "${rps[nginx,$r]}") | ${p99[$target,$r]} | $(ratio "${p99[$target,$r]}" "${p99[nginx,$r]}") |"
done
echo
echo "idem-load rate (hyper's pooled client, TCP_NODELAY, $CONNECTIONS connections, $DURATION), the same targets; wrk/idem-load is the ratio of the two clients' req/s:"
echo
echo "| target | unique keys: req/s | x nginx | p99 ms | wrk/idem-load | replays: req/s | x nginx | p99 ms | wrk/idem-load |"
echo "|---|---|---|---|---|---|---|---|---|"
apart=()
for target in "${targets[@]}"; do
    line="| $(label "$target")"
    for script in unique-keys.lua replay.lua; do
        both=$(ratio "${rps[$target,$script]}" "${lrps[$target,$script]}")
        line+=" | ${lrps[$target,$script]} | $(ratio "${lrps[$target,$script]}" "${lrps[nginx,$script]}") | ${lp99[$target,$script]} | $both"
        if clients_apart "${rps[$target,$script]}" "${lrps[$target,$script]}"; then
            apart+=("$target $script: wrk ${rps[$target,$script]}, idem-load ${lrps[$target,$script]} req/s ($both)")
        fi
    done
    echo "$line |"
done
report_apart "${apart[@]}"
echo
echo "CPU time per request of each process (user + system, from /proc; the upstream's own for \"upstream direct\"), unique keys:"
echo
echo "| target | CPU per request | x nginx |"
echo "|---|---|---|"
for target in "${targets[@]}"; do
    u=unique-keys.lua
    echo "| $(label "$target") | ${cpu[$target,$u]} us | $(ratio "${cpu[$target,$u]}" "${cpu[nginx,$u]}") |"
done
u=unique-keys.lua
# minus <a> <b>: CPU us per request of a minus b.
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
in_gateway=$(minus "${cpu[memory,$u]}" "${cpu[plain,$u]}")
in_process=$(minus "${cpu[layer,$u]}" "${cpu[direct,$u]}")
floor_added=$(minus "${cpu[floor,$u]}" "${cpu[direct,$u]}")
echo
echo "CPU the layer adds to a first execution: inside the gateway (memory store minus the proxy alone) $in_gateway us,"
echo "in process (the upstream with the layer minus without it, as bench/http.sh) $in_process us: $(ratio "$in_gateway" "$in_process")x (aim 1.20x or less)."
floor_total=$(awk -v h="${cpu[hyper,$u]}" -v f="$floor_added" 'BEGIN { printf "%.1f", h + f }')
echo "Floor of an idempotent proxy on hyper (the minimal hyper proxy plus what --floor adds to the upstream):"
echo "$floor_total us per first execution, $(ratio "$floor_total" "${cpu[nginx,$u]}")x nginx's CPU; the gateway's memory store row: $(ratio "${cpu[memory,$u]}" "$floor_total")x that floor."
if $redis; then
    redis_floor=$(awk -v h="${cpu[hyper,$u]}" -v f="${cpu[redis_floor,$u]}" -v d="${cpu[direct,$u]}" 'BEGIN { printf "%.1f", h + f - d }')
    echo "On Redis (the Redis server's CPU not counted): $redis_floor us, $(ratio "$redis_floor" "${cpu[nginx,$u]}")x nginx's CPU; the gateway's Redis row: $(ratio "${cpu[redis,$u]}" "$redis_floor")x that floor."
fi
for target in "${targets[@]}"; do
    for script in unique-keys.lua replay.lua; do
        if [ "${errs[$target,$script]}" != 0 ]; then
            echo "warning: $target $script: ${errs[$target,$script]} non-2xx responses" >&2
        fi
    done
done
$redis || echo "(Redis not measured: no server at $REDIS_URL)"

#!/usr/bin/env bash
# Fault injection: `idem serve` on Redis, then on PostgreSQL, under load with a new key per
# request (POST /echo to idem-fixture --bare), and in the middle the store killed and started
# again. Checks, and prints per store:
# - during the run only 201 and 503 answers, never a 500; a request sent after the kill and
#   answered before the restart got a 503 (fail closed);
# - after the restart, every key is retried until it has a 2xx: a key answered 503 runs once
#   then; a key answered 201 is a replay, except a key whose completion write the store lost
#   (the gateway logs "storing the response failed": it may run again after its lease, and is
#   counted); the fixture's execution counter equals the distinct keys plus those; a second
#   retry of every key is a replay and runs nothing;
# - the outage, the time the store took to answer again, and the time from the restart to the
#   gateway's first 2xx (recovery) and to its last 503.
# Exits 1 if an invariant fails.
#
#   bench/faults.sh
#   STORES=redis LOAD=60 KILL_AT=20 OUTAGE=10 bench/faults.sh
#
# The stores are private, on free ports of 127.0.0.1, in a temporary directory (the machine's
# Redis and PostgreSQL are not touched): redis-server with its append-only file (fsync always)
# and PostgreSQL (initdb, trust authentication, run as the postgres user when root). Redis is
# killed with kill -9, PostgreSQL stopped with `pg_ctl stop -m immediate` (no shutdown
# checkpoint: a crash), and both keep what they acknowledged, as a store used with idem must.
# The load comes from idem-load (bench/src/bin/idem-load), which logs the status of every key.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

STORES=${STORES:-redis postgres}
LOAD=${LOAD:-40}         # seconds of load
KILL_AT=${KILL_AT:-12}   # seconds into the load
OUTAGE=${OUTAGE:-6}      # seconds between the kill and the restart
CONNECTIONS=${CONNECTIONS:-32}
LEASE=${LEASE:-5s}       # the gateway's lease: how long a lost completion blocks its key

install_missing redis-server:redis-server redis-cli:redis-tools curl
pg_bin=$(compgen -G "/usr/lib/postgresql/*/bin" | sort -V | tail -n 1 || true)
if [[ " $STORES " == *" postgres "* ]] && [ -z "$pg_bin" ]; then
    install_missing initdb:postgresql
    pg_bin=$(compgen -G "/usr/lib/postgresql/*/bin" | sort -V | tail -n 1)
fi

build_release

work=$(mktemp -d)
chmod 755 "$work"
pids=()
redis_pid=""
pgdata=""
cleanup() {
    for p in "${pids[@]}" $redis_pid; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}" $redis_pid; do wait "$p" 2>/dev/null || true; done
    if [ -n "$pgdata" ] && [ -f "$pgdata/postmaster.pid" ]; then as_pg "$pg_bin/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# as_pg <command...>: runs a PostgreSQL tool, as the postgres user when root.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

"$fixture" --bare --listen 127.0.0.1:0 >"$work/fixture.out" 2>&1 &
pids+=($!)
upstream=$(wait_line "$work/fixture.out" "")

# Redis: a private server on $redis_port; start_redis (again) on the same port and directory.
start_redis() {
    redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save "" \
        --appendonly yes --appendfsync always --logfile "$work/redis/redis.log" &
    redis_pid=$!
    until redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG; do sleep 0.05; done
}
kill_redis() {
    kill -9 "$redis_pid"
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=""
}

# PostgreSQL: a private cluster on $pg_port.
start_pg() {
    as_pg "$pg_bin/pg_ctl" -D "$pgdata" -l "$work/pg/log" -w -t 120 \
        -o "-p $pg_port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work/pg" start >/dev/null
}
kill_pg() {
    as_pg "$pg_bin/pg_ctl" -D "$pgdata" -m immediate -w stop >/dev/null
}

# run_store <name> <store url> <kill function> <start function>: one fault-injection run;
# appends its row to $work/rows.
run_store() {
    local name=$1 url=$2 kill_fn=$3 start_fn=$4
    echo "== $name: $LOAD s of load, the store killed at $KILL_AT s for $OUTAGE s" >&2
    RUST_LOG=warn "$idem" serve --upstream "http://$upstream" --listen 127.0.0.1:0 \
        --admin-listen 127.0.0.1:0 --store "$url" --lease "$LEASE" >"$work/$name.gateway.log" 2>&1 &
    local gateway=$!
    pids+=("$gateway")
    local addr
    addr=$(wait_line "$work/$name.gateway.log" "listening on ")
    curl -sf -X POST "http://$upstream/reset" >/dev/null
    "$load" unique --addr "$addr" --duration "$LOAD" --connections "$CONNECTIONS" \
        --prefix "$name$(now_ms)" --log "$work/$name.requests" &
    local loader=$!
    sleep "$KILL_AT"
    "$kill_fn"
    local down up ready
    down=$(now_ms)
    echo "$name: killed" >&2
    sleep "$OUTAGE"
    up=$(now_ms)
    "$start_fn"
    ready=$(now_ms)
    echo "$name: restarted, answering after $((ready - up)) ms" >&2
    wait "$loader"
    local status=0
    "$load" check --addr "$addr" --fixture "$upstream" --store "$name" --connections "$CONNECTIONS" \
        --log "$work/$name.requests" --gateway-log "$work/$name.gateway.log" \
        --down-ms "$down" --up-ms "$up" --ready-ms "$ready" >"$work/$name.report" || status=$?
    grep -v '^| ' "$work/$name.report" || true
    grep '^| ' "$work/$name.report" >>"$work/rows" || true
    kill "$gateway" 2>/dev/null || true
    wait "$gateway" 2>/dev/null || true
    return "$status"
}

failed=0
: >"$work/rows"
for store in $STORES; do
    case $store in
    redis)
        redis_port=$(free_port)
        mkdir -p "$work/redis"
        start_redis
        run_store redis "redis://127.0.0.1:$redis_port" kill_redis start_redis || failed=1
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        redis_pid=""
        ;;
    postgres)
        pg_port=$(free_port)
        pgdata="$work/pg/data"
        mkdir -p "$work/pg"
        [ "$(id -u)" -ne 0 ] || chown postgres "$work/pg"
        as_pg "$pg_bin/initdb" -D "$pgdata" -A trust -U postgres >/dev/null
        start_pg
        run_store postgres "postgres://postgres@127.0.0.1:$pg_port/postgres" kill_pg start_pg || failed=1
        as_pg "$pg_bin/pg_ctl" -D "$pgdata" -m fast -w stop >/dev/null || true
        ;;
    *)
        echo "unknown store $store (redis, postgres)" >&2
        exit 2
        ;;
    esac
done

echo
echo "idem serve (lease $LEASE), idem-load -c $CONNECTIONS: $LOAD s of POST /echo with a new key per request to idem-fixture --bare; the store killed at +$KILL_AT s and started again $OUTAGE s later; $(nproc) cores shared, $(date -u +%Y-%m-%d)"
echo
echo "| store | requests | 201 | 503 | 500 | other | outage s | store up after s | first 2xx after restart s | last 503 after restart s | executions | distinct keys | completions not stored / ran again | checks |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
cat "$work/rows"
if [ "$failed" -ne 0 ]; then
    echo "FAILED: an invariant does not hold (see above)" >&2
    exit 1
fi

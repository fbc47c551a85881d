#!/usr/bin/env bash
# Instructions per claim+complete cycle, MemoryStore next to the Mutex<HashMap> baseline, and
# instructions per request through the HTTP layer (on the MemoryStore) next to the same handler
# without it (no network: tower calls in one thread), counted by valgrind's callgrind. Unlike wall time, the count does not depend on what
# else the machine is doing. Each workload runs twice, with 0 and with N cycles; the difference
# divided by N is the cost of one cycle (set-up and tear-down cancel out).
set -euo pipefail
cd "$(dirname "$0")/.."
# `bench/instructions.sh gateway` counts the gateway and nginx only.
only_gateway=false
if [ "${1:-}" = gateway ]; then only_gateway=true; shift; fi
cycles=${1:-100000}

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
bin="${CARGO_TARGET_DIR:-target}/release/examples/instructions"
if ! $only_gateway; then
cargo build --quiet --release -p idem-bench --example instructions
cargo build --quiet --release -p idem-http --example layer_instructions

count() { # count <binary> <workload> <n>
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" "$3" 2>&1 \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

per_cycle() { # per_cycle <workload> [n] [binary]
    local n=${2:-$cycles} exe=${3:-$bin} empty full
    empty=$(count "$exe" "$1" 0)
    full=$(count "$exe" "$1" "$n")
    echo $(((full - empty) / n))
}

store=$(per_cycle store)
baseline=$(per_cycle baseline)
echo "instructions per claim+complete cycle ($cycles cycles, 1 thread):"
echo "  memory_store            $store"
echo "  mutex_hashmap_baseline  $baseline"
awk -v s="$store" -v b="$baseline" 'BEGIN { printf "  ratio store/baseline    %.2f\n", s / b }'

# The HTTP layer: idem-http's example runs POST /echo requests (unique keys, 32-byte body)
# through the layer or through the bare handler. Valgrind's CPU has no SHA extensions, so
# SHA-256 runs in software here (about 7,000 instructions per request that a machine with
# SHA-NI or ARMv8 crypto spends a few hundred on); the figure is an upper bound.
requests=$((cycles / 5))
layer=$(per_cycle layer "$requests" "$(dirname "$bin")/layer_instructions")
echo "instructions per request ($requests requests, 1 thread, no network):"
echo "  layer on MemoryStore    $layer"
bare=$(per_cycle bare "$requests" "$(dirname "$bin")/layer_instructions")
echo "  bare handler            $bare"
awk -v s="$layer" -v b="$bare" 'BEGIN { printf "  added by the layer      %d\n", s - b }'
replayed=$(per_cycle replay "$requests" "$(dirname "$bin")/layer_instructions")
echo "  replay on MemoryStore   $replayed"
awk -v s="$replayed" -v b="$bare" 'BEGIN { printf "  replay/bare handler     %.2f\n", s / b }'
fi

# The gateway (`idem serve`, one serving thread) and nginx (`master_process off; daemon off;
# worker_processes 1`, a keep-alive pool to the upstream), each under callgrind in front of the
# same idem-fixture --bare (not counted), driven by bench/examples/proxy_load.rs: POST /echo
# with a 32-byte body over one keep-alive connection, one request after the other. Each figure
# is the server's instructions (every thread) from callgrind's counters zeroed after a warm-up
# to their dump after N more requests, divided by N (bench/callgrind_per_request.py).
# `IDEM=path/to/idem bench/instructions.sh gateway` counts another build of the gateway.
proxy_requests=${PROXY_REQUESTS:-2000}
. bench/lib.sh
install_missing nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
# BUILD=no: the binaries built already.
# (Two builds: with --example, cargo builds only the examples named, not the binaries.)
if [ "${BUILD:-yes}" != no ]; then
    cargo build --quiet --release -p idem-fixture -p idem-gateway
    cargo build --quiet --release -p idem-bench --example proxy_load --example hyper_proxy
fi
release="$(dirname "$(dirname "$bin")")"
idem=${IDEM:-$release/idem}
load="$release/examples/proxy_load"
work=$(mktemp -d)
"$release/idem-fixture" --bare --listen 127.0.0.1:0 >"$work/fixture.out" 2>&1 &
fixture_pid=$!
trap 'kill $fixture_pid 2>/dev/null || true; rm -rf "$work"' EXIT
upstream=$(wait_line "$work/fixture.out" "")
printf '[server]\nworkers = 1\n' >"$work/memory.toml"
printf '[server]\nworkers = 1\n[idempotency]\nenabled = false\n' >"$work/plain.toml"

per_request() { # per_request <unique|replay> <listen> <top> <command>...
    local mode=$1 listen=$2 top=$3
    shift 3
    python3 bench/callgrind_per_request.py --load "$load" --addr "$listen" --mode "$mode" \
        --path "${LOAD_PATH:-/echo}" --requests "$proxy_requests" --top "$top" -- "$@"
}
gateway() { # gateway <unique|replay> <config> <top>
    local listen
    listen="127.0.0.1:$(free_port)"
    RUST_LOG=warn per_request "$1" "$listen" "$3" "$idem" serve --config "$work/$2.toml" \
        --upstream "http://$upstream" --listen "$listen" --admin-listen 127.0.0.1:0 --store memory
}
nginx_port=$(free_port)
nginx_conf "$work" "$upstream" "$nginx_port" "master_process off; daemon off; worker_processes 1;"

top=${TOP:-15}
echo "instructions per proxied request ($proxy_requests requests after a warm-up, one keep-alive connection, the server under callgrind):"
nginx=$(per_request unique "127.0.0.1:$nginx_port" 0 "$NGINX" -c "$work/nginx.conf" -p "$work/nginx" -e "$work/nginx/error.log")
echo "  nginx proxy_pass                   $nginx"
gateway unique plain "$top" >"$work/plain.out"
plain=$(head -1 "$work/plain.out")
echo "  idem serve, idempotency off        $plain"
gateway unique memory 40 >"$work/memory.out"
first=$(head -1 "$work/memory.out")
echo "  idem serve, memory, first runs     $first"
# SHA-256 of the fingerprint: valgrind's CPU has no SHA extensions, so it runs in software here.
sha=$(awk '$3 == "sha2::sha256::compress256" { print $1 }' "$work/memory.out")
echo "    of which SHA-256 in software     ${sha:-0} (a CPU with SHA-NI or ARMv8 crypto spends a few hundred)"
replay=$(gateway replay memory 0)
echo "  idem serve, memory, replays        $replay"
awk -v p="$plain" -v f="$first" -v r="$replay" -v n="$nginx" 'BEGIN {
    printf "  x nginx: proxy alone %.2f, first runs %.2f, replays %.2f\n", p / n, f / n, r / n
    printf "  added by idempotency to a first run: %d; a replay (no upstream call): %.2f of the proxy alone\n", f - p, r / p }'
# The floor of a proxy on hyper (bench/examples/hyper_proxy.rs, one serving thread), and the
# layer in process as bench/http.sh runs it: idem-fixture with the layer on the memory store
# and --bare, driven over TCP by the same load (the upstream itself, not behind a proxy).
listen="127.0.0.1:$(free_port)"
hyper=$(per_request unique "$listen" 0 "$release/examples/hyper_proxy" "$listen" "$upstream" 1)
echo "  floor: a minimal hyper proxy       $hyper"
fixture() { # fixture <flags...>: idem-fixture's instructions per request
    local listen
    listen="127.0.0.1:$(free_port)"
    per_request unique "$listen" 0 "$release/idem-fixture" --listen "$listen" --retention-ms 600000 "$@"
}
bare=$(fixture --bare)
echo "  idem-fixture --bare (the upstream) $bare"
layer=$(fixture --store memory)
echo "  idem-fixture, layer, memory        $layer"
# --floor: the least any idempotency layer adds (key, body, SHA-256, one Mutex<HashMap>).
floor=$(fixture --floor)
echo "  idem-fixture --floor               $floor"
# The same around a handler that pends, as a proxied request does (POST /slow?ms=1: the
# fixture's handler sleeps 1 ms before it answers), so that the layer keeps the lease's
# heartbeat armed while it waits; the sleep is in both counts and cancels out.
slow_bare=$(LOAD_PATH="/slow?ms=1" fixture --bare)
echo "  idem-fixture --bare, /slow?ms=1    $slow_bare"
slow_layer=$(LOAD_PATH="/slow?ms=1" fixture --store memory)
echo "  idem-fixture, layer, /slow?ms=1    $slow_layer"
awk -v p="$plain" -v f="$first" -v b="$bare" -v l="$layer" -v h="$hyper" -v n="$nginx" \
    -v sb="$slow_bare" -v sl="$slow_layer" -v fl="$floor" -v s="${sha:-0}" 'BEGIN {
    printf "  x nginx: hyper floor %.2f; the proxy alone %.2f of the hyper floor\n", h / n, p / h
    printf "  added by the layer: in the gateway %d, in process %d: %.2fx (aim 1.20x or less)\n", f - p, l - b, (f - p) / (l - b)
    printf "  added by the layer around a handler that pends: %d (%d more than around one answered at once; aim under 3,000); inside the gateway %.2fx that\n", sl - sb, (sl - sb) - (l - b), (f - p) / (sl - sb)
    printf "  first runs against the proxy alone: %.2fx (aim 1.40x); the floor of an idempotent proxy (the proxy alone plus what --floor adds in process, %d): %.2fx the proxy alone, the gateway %.2fx that floor\n", f / p, fl - b, (p + fl - b) / p, f / (p + fl - b)
    printf "  without SHA-256 in software (as on a CPU with SHA extensions): first runs %.2fx the proxy alone\n", (f - s) / p }'
echo "the proxy alone, its $top costliest functions (instructions per request, self):"
tail -n +2 "$work/plain.out"

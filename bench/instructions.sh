#!/usr/bin/env bash
# Instructions per claim+complete cycle, MemoryStore next to the Mutex<HashMap> baseline, and
# instructions per request through the HTTP layer (on the MemoryStore) next to the same handler
# without it (no network: tower calls in one thread), counted by valgrind's callgrind. Unlike wall time, the count does not depend on what
# else the machine is doing. Each workload runs twice, with 0 and with N cycles; the difference
# divided by N is the cost of one cycle (set-up and tear-down cancel out).
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-100000}

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --quiet --release -p idem-bench --example instructions
cargo build --quiet --release -p idem-http --example layer_instructions
bin="${CARGO_TARGET_DIR:-target}/release/examples/instructions"

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

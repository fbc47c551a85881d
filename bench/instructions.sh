#!/usr/bin/env bash
# Instructions per claim+complete cycle, MemoryStore next to the Mutex<HashMap> baseline, counted
# by valgrind's callgrind on one thread. Unlike wall time, the count does not depend on what
# else the machine is doing. Each workload runs twice, with 0 and with N cycles; the difference
# divided by N is the cost of one cycle (set-up and tear-down cancel out).
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-100000}

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --quiet --release -p idem-bench --example instructions
bin="${CARGO_TARGET_DIR:-target}/release/examples/instructions"

count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

per_cycle() {
    local empty full
    empty=$(count "$1" 0)
    full=$(count "$1" "$cycles")
    echo $(((full - empty) / cycles))
}

store=$(per_cycle store)
baseline=$(per_cycle baseline)
echo "instructions per claim+complete cycle ($cycles cycles, 1 thread):"
echo "  memory_store            $store"
echo "  mutex_hashmap_baseline  $baseline"
awk -v s="$store" -v b="$baseline" 'BEGIN { printf "  ratio store/baseline    %.2f\n", s / b }'

#!/usr/bin/env bash
# Jobs per second of a NATS JetStream consumer through idem-worker's JobGuard on the Redis
# store, against the same consumer without the guard, in one run on the same servers
# (examples/worker-nats/examples/bench.rs). Each job is trivial (a counter), so the figure is
# the guard's whole cost: two Redis round trips per job (claim, complete) on top of the
# consumer's pull and double_ack.
#
#   bench/worker.sh                                  # 20,000 jobs, 64 at a time, best of 3
#   JOBS=50000 CONCURRENCY=128 ROUNDS=5 bench/worker.sh
#
# Needs NATS with JetStream (IDEM_TEST_NATS_URL, default 127.0.0.1:4222) and Redis
# (IDEM_TEST_REDIS_URL, default redis://127.0.0.1:6379): the servers .ci/run starts.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-20000}
CONCURRENCY=${CONCURRENCY:-64}
ROUNDS=${ROUNDS:-3}

cargo build --release -q -p worker-nats --example bench
target=${CARGO_TARGET_DIR:-target}
echo "machine: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$target/release/examples/bench" --jobs "$JOBS" --concurrency "$CONCURRENCY" --rounds "$ROUNDS"

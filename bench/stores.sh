#!/usr/bin/env bash
# The durable stores' throughput next to the same work done plainly, on the same machine, in
# one run:
#   - PostgreSQL: claim + complete cycles per second of PostgresStore
#     (idem-store-postgres/examples/postgres_claim_complete.rs) at 1 and 16 tasks, next to a
#     plain INSERT + UPDATE of one row with the same driver and pool (two autocommit
#     statements, like the store's two transitions), and two columns that show where the
#     store's time goes: "by hand", the store's own two statements (create-if-absent,
#     compare-and-set) bound and sent by the plain client without the store's Rust around
#     them, and "wide", a plain INSERT + UPDATE of the same record columns in the store's own
#     table (its row width and indexes). The columns' runs alternate in SLICES slices each;
#   - redb: claim + complete cycles per second of RedbStore
#     (idem-store-redb/examples/redb_claim_complete.rs) at 1 and 16 tasks, next to plain redb:
#     one insert and one update per cycle, each a durable write transaction (redb's defaults,
#     and again with quick repair, as the store commits).
# Each prints cycles/s and the ratio store / baseline.
#
#   bench/stores.sh
#   SECONDS_PER_RUN=10 SLICES=10 TASKS="1 16 64" bench/stores.sh
#   IDEM_BENCH_POSTGRES_URL=postgres://user@host:5432/db bench/stores.sh   # another server
#   IDEM_BENCH_DIR=/mnt/ssd bench/stores.sh                                # redb files there
#
# PostgreSQL must be running (see .ci/run); its run works in a schema of its own and drops it
# at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

export SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
export TASKS=${TASKS:-"1 16"}
export IDEM_BENCH_POSTGRES_URL=${IDEM_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}

echo "building the examples (release)" >&2
cargo build --release -q -p idem-store-postgres --example postgres_claim_complete
cargo build --release -q -p idem-store-redb --example redb_claim_complete
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
examples="$target_dir/release/examples"
echo "load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "== PostgreSQL: PostgresStore claim+complete vs plain INSERT+UPDATE (same driver and pool)"
"$examples/postgres_claim_complete"

echo
echo "== redb: RedbStore claim+complete vs plain redb insert+update (two durable transactions)"
"$examples/redb_claim_complete"

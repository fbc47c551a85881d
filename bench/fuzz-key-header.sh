#!/usr/bin/env bash
# Fuzzes the Idempotency-Key parser and the stored-response decoder of idem-http with
# cargo-fuzz (libFuzzer), SECONDS_EACH seconds per target (default 60).
#
#   bench/fuzz-key-header.sh            # both targets, 60 s each
#   SECONDS_EACH=600 bench/fuzz-key-header.sh key_header
#
# cargo-fuzz needs nightly flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them.
# Crashes land in idem-http/fuzz/artifacts/<target>/ (ignored by git: turn each into a unit test).
set -euo pipefail
cd "$(dirname "$0")/../idem-http/fuzz"

SECONDS_EACH=${SECONDS_EACH:-60}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(key_header response_codec)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found: installing it from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    if [ "$target" = key_header ]; then
        # Seeds: one accepted and one refused value of each shape (the first byte picks strict).
        printf '\x00"abc"' >corpus/key_header/quoted
        printf '\x00abc' >corpus/key_header/bare
        printf '\x01"a\\"b"' >corpus/key_header/escaped
        printf '\x00"a", "b"' >corpus/key_header/list
        printf '\x00"a";p=1' >corpus/key_header/params
    fi
    echo "==> cargo fuzz run $target for ${SECONDS_EACH}s" >&2
    log=$(mktemp)
    if ! cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$SECONDS_EACH" -max_len=1024 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "==> $target: the fuzzer found a failure (see artifacts/$target/)" >&2
        exit 1
    fi
    grep -E '^#[0-9]+[[:space:]]+DONE' "$log" >&2 || tail -n 3 "$log" >&2
    rm -f "$log"
    echo "==> $target: no failure in ${SECONDS_EACH}s" >&2
done

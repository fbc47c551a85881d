#!/usr/bin/env bash
# Runs the cargo-fuzz (libFuzzer) targets of fuzz/ for SECONDS_EACH seconds each (default 60),
# seeded with the committed corpus fuzz/seeds/<target>/, and prints per target the executions,
# the rate and the outcome, then a summary table (markdown).
#
#   bench/fuzz.sh                          # every target, 60 s each
#   SECONDS_EACH=600 bench/fuzz.sh redb_record gateway_config
#   MINIMIZE=1 bench/fuzz.sh               # then merge what was found into fuzz/seeds/ (cmin)
#
# New inputs go to fuzz/corpus/<target>/ and crashes to fuzz/artifacts/<target>/ (both ignored
# by git): turn each crash into a unit test of the crate it broke, then fix the crate. With
# MINIMIZE=1 the seeds are replaced by the smallest set of seeds and new inputs that covers as
# many edges (libFuzzer's -set_cover_merge=1, what `cargo fuzz cmin` does with -merge=1); commit
# that if it stays small.
#
# cargo-fuzz needs nightly flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them. It is
# installed from crates.io when missing. Every target is built once, up front, with the default
# flags of `cargo fuzz build` (optimized, debug assertions and overflow checks, AddressSanitizer).
# Exits non-zero if any target failed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

SECONDS_EACH=${SECONDS_EACH:-60}
MAX_LEN=${MAX_LEN:-8192}
MINIMIZE=${MINIMIZE:-0}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found: installing it from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)

# One build for every run: the binaries are run directly below (`cargo fuzz run` would check
# the build again before each target, and rebuild what changed in the checkout meanwhile).
echo "==> cargo fuzz build" >&2
if [ ${#targets[@]} -eq 1 ]; then
    cargo fuzz build "${targets[0]}" >&2
else
    cargo fuzz build >&2
fi
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin_dir="$target_dir/$(rustc -vV | sed -n 's/^host: //p')/release"

# fuzz <target> <libFuzzer arguments...>: runs a built target from fuzz/.
fuzz() {
    local target=$1
    shift
    mkdir -p "artifacts/$target"
    "$bin_dir/$target" -artifact_prefix="artifacts/$target/" -max_len="$MAX_LEN" -timeout=10 "$@"
}

# stat <name> <log>: a value of libFuzzer's -print_final_stats, or "?".
stat() {
    sed -n "s/^stat::$1:[[:space:]]*//p" "$2" | tail -n 1 | grep . || echo "?"
}

rows=()
failed=0
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "seeds/$target"
    seeds_before=$(find "seeds/$target" -type f | wc -l)
    echo "==> $target: ${SECONDS_EACH}s from $seeds_before seeds" >&2
    log=$(mktemp)
    start=$(date +%s)
    if fuzz "$target" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
        "corpus/$target" "seeds/$target" >"$log" 2>&1; then
        outcome="no crash"
    else
        outcome="FAILED"
        failed=1
        tail -n 40 "$log" >&2
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        [ -z "$artifact" ] || outcome="FAILED: $artifact"
    fi
    seconds=$(( $(date +%s) - start ))
    execs=$(stat number_of_executed_units "$log")
    rate=$(stat average_exec_per_sec "$log")
    rss=$(stat peak_rss_mb "$log")
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2 || true)
    corpus=$(find "corpus/$target" -type f | wc -l)
    echo "==> $target: $execs executions in ${seconds}s ($rate/s), coverage ${cov:-?}," \
        "peak RSS ${rss} MB, $corpus corpus inputs: $outcome" >&2
    rows+=("| $target | $seconds | $execs | $rate | ${cov:-?} | $outcome |")
    rm -f "$log"

    if [ "$MINIMIZE" = 1 ] && [ "$outcome" = "no crash" ]; then
        merged=$(mktemp -d)
        # The smallest set of inputs that covers the same edges (counters left out: a set
        # per hit count would keep hundreds of inputs more).
        fuzz "$target" -set_cover_merge=1 -use_counters=0 "$merged" "seeds/$target" \
            "corpus/$target" >/dev/null 2>&1
        rm -rf "seeds/$target"
        mkdir -p "seeds/$target"
        cp "$merged"/* "seeds/$target/" 2>/dev/null || true
        rm -rf "$merged"
        echo "==> $target: seeds minimized to $(find "seeds/$target" -type f | wc -l) files," \
            "$(find "seeds/$target" -type f -exec cat {} + | wc -c) bytes" >&2
    fi
done

echo
echo "| target | seconds | executions | executions/s | coverage | outcome |"
echo "| --- | ---: | ---: | ---: | ---: | --- |"
printf '%s\n' "${rows[@]}"
exit "$failed"

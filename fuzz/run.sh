#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/libfuzzer) with the coverage
# instrumentation cargo-fuzz uses, on the stable toolchain, and runs one:
#   fuzz/run.sh TARGET SECONDS [libFuzzer options...]
# TARGET is `requests`, `chains` or `host`; the seed corpus is fuzz/corpus/TARGET
# (read, never written: new inputs go to $FUZZ_WORK, default
# target/fuzz-work/TARGET). A finding leaves its input in $FUZZ_WORK and
# fails the run. FUZZ_BUILD_ONLY=1 only builds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:?usage: fuzz/run.sh requests|chains|host SECONDS [libFuzzer options]}"
seconds="${2:-60}"
shift $(( $# >= 2 ? 2 : $# ))
case "$target" in requests|chains|host) ;; *) echo "unknown target $target" >&2; exit 2 ;; esac

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/../target/fuzz}"
# What `cargo fuzz build -s none` passes: libFuzzer's coverage counters,
# comparison tracing and `cfg(fuzzing)`; debug assertions stay on.
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# With --target the flags reach only the targets' code, not build scripts.
host="$(rustc -vV | sed -n 's/^host: //p')"
cargo build --release --target "$host" --manifest-path "$here/libfuzzer/Cargo.toml" --bins
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

work="${FUZZ_WORK:-$CARGO_TARGET_DIR/fuzz-work/$target}"
mkdir -p "$work/corpus" "$work/artifacts"
# -rss_limit_mb: the volume grows with the inputs; a leak still shows.
"$CARGO_TARGET_DIR/$host/release/$target" \
    -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=60 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
    "$@" "$work/corpus" "$here/corpus/$target"

#!/usr/bin/env bash
# The cost of the metrics endpoint on the data path, in one run, through
# the virtio-fs driver harness (`sluice bench virtiofs`): two `sluice serve`
# daemons on the same volume, one with `--no-metrics`, the other with
# `--metrics` scraped every second (curl, as Prometheus would), both read
# with 4 KiB READs (warm: the file is read once before measuring). Each
# order is run once (A then B, B then A), so that which daemon ran first
# does not decide the ratio.
#
# Usage: benches/vs-metrics.sh [--seconds S] [--block-size SIZE] [--baseline BIN] [--keep]
# --baseline BIN: the first daemon is BIN (a sluice built before the
# counters existed) instead of this build with --no-metrics: the cost of
# the counters themselves, not only of the endpoint.
# Needs root (the harness's shared memory) and curl.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=10
block=4K
baseline=
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=${2:?}; shift 2 ;;
    --block-size) block=${2:?}; shift 2 ;;
    --baseline) baseline=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v curl >/dev/null || { echo "needs curl" >&2; exit 1; }

(cd "$repo" && cargo build --release --quiet --bin sluice)
sluice=$repo/target/release/sluice
work=$(mktemp -d /var/tmp/sluice-vs-metrics.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

wait_socket() {
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "no socket at $1; logs in $work" >&2
    exit 1
}

"$sluice" format "sqlite3://$work/meta.db" bench --bucket "$work/objects" >/dev/null
if [ -n "$baseline" ]; then
    plain=("$baseline" serve)
    label="$baseline"
else
    plain=("$sluice" serve --no-metrics)
    label="--no-metrics"
fi
"${plain[@]}" "sqlite3://$work/meta.db" --socket "$work/plain.sock" \
    >"$work/plain.log" 2>&1 &
pids+=($!)
"$sluice" serve "sqlite3://$work/meta.db" --socket "$work/metrics.sock" \
    --metrics 127.0.0.1:0 >"$work/metrics.log" 2>&1 &
pids+=($!)
wait_socket "$work/plain.sock"
wait_socket "$work/metrics.sock"
addr=
for _ in $(seq 200); do
    addr=$(sed -n 's|.*metrics on http://\([^/]*\)/metrics.*|\1|p' "$work/metrics.log" | head -1)
    [ -n "$addr" ] && break
    sleep 0.05
done
[ -n "$addr" ] || { echo "no metrics address in $work/metrics.log" >&2; exit 1; }
scrapes=$work/scrapes
(while sleep 1; do curl -sf "http://$addr/metrics" >/dev/null && echo >>"$scrapes"; done) &
pids+=($!)

run() {
    "$sluice" bench virtiofs --socket "$1" --vs-socket "$2" --block-size "$block" \
        --depth 32 --seconds "$seconds" --file metrics-bench.dat --file-size 64M
}
echo "== A: $label, B: --metrics scraped every second ($block READs)"
run "$work/plain.sock" "$work/metrics.sock"
echo
echo "== A: --metrics scraped every second, B: $label ($block READs)"
run "$work/metrics.sock" "$work/plain.sock"
echo
echo "scrapes answered during the run: $(wc -l <"$scrapes")"

#!/usr/bin/env bash
# How READ data from local files reaches guest memory: `sluice serve
# --guest-io pread` (the kernel copies from its page cache) against
# `--guest-io direct` (what the page cache misses goes O_DIRECT from the
# disk straight into guest memory, on a waiter thread) and `--guest-io
# uring` (the worker's io_uring ring into registered guest memory), side by
# side in one run, through the virtio-fs driver harness.
#
#   - one file:// volume (SQLite + a directory on this disk), one file of
#     --file-size written through the harness; three daemons serve it, each
#     with a 1 MiB memory cache and no readahead or prefetch, so every READ
#     reaches the block objects on disk;
#   - for each block size (4K, 128K, 1M): "cold" runs with the page cache
#     dropped every --drop-every seconds (default 0.05; a stand-in for a
#     file larger than the page cache — on a machine whose disk reads fast
#     the pages come back between drops, so the per-daemon counts of READ
#     bytes by path at the end say how much really came from the disk),
#     "warm" runs with the file in the page cache;
#   - prints GB/s, the daemon's CPU-seconds per GB delivered (utime + stime
#     from /proc/PID/stat over the run), each mode's ratio to pread, and the
#     CPU per GB as a multiple of a single-core memcpy's (measured after the
#     pread run of each line: `bench virtiofs --vs-memcpy`).
#
# --disk-cache: the READs are disk-cache hits instead. Each daemon gets a
# disk cache of its own (--cache-dir in the work directory), filled before
# the runs by one in-order pass over the file (`bench virtiofs
# --warm-first`); a READ then finds its block in the disk cache and not in
# the 1 MiB memory cache: served as a range of the cache file, checked in
# place (a sluice before that promoted the whole block into the memory
# cache). "cold"/"warm" are then about the cache files' pages.
#
# --sluice PATH measures another build of sluice (an older one, to compare;
# compare figures of one host and one load only).
#
# Usage: benches/vs-guest-io.sh [--seconds S] [--file-size SIZE] [--states "cold warm"]
#                               [--drop-every S] [--serve-args "ARGS"] [--keep]
#                               [--disk-cache] [--sluice PATH]
#
# --serve-args adds flags to every daemon: e.g. "--user root" on a host whose
# locked-memory limit `nobody` cannot raise (a container without
# CAP_SYS_RESOURCE), where `uring` could not register guest memory and would
# measure its pread fallback (its log says so).
# Needs root (drop_caches). Compare figures within one run only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=5
file_size=2G
states="cold warm"
drop_every=0.05
keep=0
serve_args=
disk_cache=0
sluice=
while [ $# -gt 0 ]; do
    case "$1" in
    --disk-cache) disk_cache=1; shift ;;
    --sluice) sluice=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
    --file-size) file_size=${2:?}; shift 2 ;;
    --states) states=${2:?}; shift 2 ;;
    --drop-every) drop_every=${2:?}; shift 2 ;;
    --serve-args) serve_args=${2?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$sluice" ]; then
    (cd "$repo" && cargo build --release --quiet --bin sluice)
    sluice=$repo/target/release/sluice
fi
work=$(mktemp -d /var/tmp/sluice-vs-guest-io.XXXXXX)
pids=()
dropper=
cleanup() {
    [ -n "$dropper" ] && kill "$dropper" 2>/dev/null || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

modes=(pread direct uring)
declare -A pid_of
"$sluice" format "sqlite3://$work/meta.db" bench --bucket "$work/objects" >/dev/null
for m in "${modes[@]}"; do
    cache_args=()
    [ "$disk_cache" = 1 ] && cache_args=(--cache-dir "$work/cache-$m" --free-space-ratio 0)
    "$sluice" serve "sqlite3://$work/meta.db" --socket "$work/$m.sock" --no-pin \
        --cache-size 1 --max-readahead 0 --prefetch 0 --readahead-ratio 0 \
        --guest-io "$m" --no-metrics "${cache_args[@]}" $serve_args >"$work/$m.log" 2>&1 &
    pids+=($!)
    pid_of[$m]=$!
done
for m in "${modes[@]}"; do
    for _ in $(seq 200); do [ -S "$work/$m.sock" ] && break; sleep 0.05; done
    [ -S "$work/$m.sock" ] || { echo "no socket for $m; see $work/$m.log" >&2; exit 1; }
done

tick=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# One run: prints "GB/s CPU-s/GB memcpy-CPU-s/GB" (the last 0 without
# --vs-memcpy, the fourth argument).
run() {
    local mode=$1 bs=$2 depth=$3 memcpy=${4:-} before after out gbs mc
    before=$(cpu_ticks "${pid_of[$mode]}")
    out=$("$sluice" bench virtiofs --socket "$work/$mode.sock" --file-size "$file_size" \
        --block-size "$bs" --depth "$depth" --seconds "$seconds" $memcpy)
    after=$(cpu_ticks "${pid_of[$mode]}")
    gbs=$(echo "$out" | grep -oE '[0-9.]+ GB/s' | head -n 1 | cut -d' ' -f1)
    mc=$(echo "$out" | grep -oE 'memcpy 1 core +[0-9.]+ GB/s +[0-9.]+ CPU-s/GB' | grep -oE '[0-9.]+ CPU-s/GB' | cut -d' ' -f1)
    awk -v gbs="$gbs" -v t=$((after - before)) -v hz="$tick" -v s="$seconds" -v mc="${mc:-0}" \
        'BEGIN { gb = gbs * s; printf "%.3f %.4f %s\n", gbs, (gb > 0 ? t / hz / gb : 0), mc }'
}

echo "sluice ($("$sluice" --version)); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); file $file_size on $(df -T "$work" | awk 'NR==2 {print $2}')"
# The file: written once through the pread daemon (all three serve it).
"$sluice" bench virtiofs --socket "$work/pread.sock" --file-size "$file_size" --seconds 1 >/dev/null
cached_files="$work/objects/bench/chunks/*/*/*"
if [ "$disk_cache" = 1 ]; then
    # Each daemon's disk cache: one in-order pass, then wait until every
    # block object has its cache file (inserts are written in the background).
    objects=$(find "$work/objects/bench/chunks" -type f | wc -l)
    for m in "${modes[@]}"; do
        "$sluice" bench virtiofs --socket "$work/$m.sock" --file-size "$file_size" --seconds 1 \
            --warm-first >/dev/null
        for _ in $(seq 600); do
            [ "$(find "$work/cache-$m" -type f -name '*_*_*' ! -name '.*' | wc -l)" -ge "$objects" ] && break
            sleep 0.1
        done
    done
    cached_files="$work/cache-*/*/raw/chunks/*/*/*"
    echo "disk caches filled: $objects blocks each"
fi

printf '\n%-6s %-5s %-7s %10s %10s %8s %8s %10s\n' state bs mode GB/s CPU-s/GB "GB/s×" "CPU×" "CPU/memcpy"
for state in $states; do
    for bs in 4K 128K 1M; do
        depth=16
        [ "$bs" = 4K ] && depth=32
        declare -A res=()
        for mode in "${modes[@]}"; do
            sync
            echo 3 >/proc/sys/vm/drop_caches
            if [ "$state" = cold ]; then
                (while :; do echo 1 >/proc/sys/vm/drop_caches; sleep "$drop_every"; done) &
                dropper=$!
            else
                # Warm: one pass fills the page cache (the memory cache is 1 MiB).
                # shellcheck disable=SC2086 # a glob
                cat $cached_files >/dev/null 2>&1 || true
            fi
            memcpy=
            [ "$mode" = pread ] && memcpy=--vs-memcpy
            res[$mode]=$(run "$mode" "$bs" "$depth" $memcpy)
            if [ -n "$dropper" ]; then kill "$dropper"; wait "$dropper" 2>/dev/null || true; dropper=; fi
        done
        read -r base_gbs base_cpu memcpy_cpu <<<"${res[pread]}"
        for mode in "${modes[@]}"; do
            read -r gbs cpu _ <<<"${res[$mode]}"
            awk -v st="$state" -v bs="$bs" -v m="$mode" -v g="$gbs" -v c="$cpu" -v bg="$base_gbs" -v bc="$base_cpu" -v mc="$memcpy_cpu" \
                'BEGIN { printf "%-6s %-5s %-7s %10.3f %10.4f %8.2f %8.2f %10.2f\n", st, bs, m, g, c, (bg > 0 ? g / bg : 0), (bc > 0 ? c / bc : 0), (mc > 0 ? c / mc : 0) }'
        done
    done
done
echo
echo "READ bytes by path, per daemon (at disconnect):"
for m in "${modes[@]}"; do kill -TERM "${pid_of[$m]}" 2>/dev/null || true; done
sleep 1
for m in "${modes[@]}"; do
    echo "$m: $(grep -h 'file READ bytes' "$work/$m.log" | tail -n 1 | sed 's/.*file READ bytes: //')"
    if [ "$disk_cache" = 1 ]; then
        grep -h 'disk cache: [0-9]* hits' "$work/$m.log" | sed 's/.*disk cache: //' |
            awk '{ h += $1; hm += substr($3, 2); mi += $5; mm += substr($7, 2) }
                 END { printf "  disk cache, all sessions: %d hits (%d MiB), %d misses (%d MiB)\n", h, hm, mi, mm }'
    fi
done
if grep -q "cannot be registered with io_uring" "$work/uring.log"; then
    echo "NOTE: the uring daemon could not register guest memory (see its log): its lines measure the pread fallback"
fi

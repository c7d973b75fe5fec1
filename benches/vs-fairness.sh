#!/usr/bin/env bash
# Fair sharing between VMs: how much one VM streaming cold data moves
# another VM's cached-read latency, with the VMs behind one `sluice host`
# (each `sluice serve --host`) against the same two VMs on standalone
# `sluice serve` daemons, side by side in one run, each VM driven by the
# virtio-fs driver harness (`sluice bench virtiofs`).
#
#   - one volume (SQLite + a file:// directory on this disk, or with --s3 a
#     local S3 server: `moto_server`, which must be installed); two files
#     written once: `hot.dat` (--hot-size, default 64M), which VM A reads,
#     and `cold.dat` (--cold-size, default 512M), which VM B streams;
#   - for each setup, fresh daemons: VM A reads `hot.dat` once in order
#     (warming the caches) and then random --block-size READs (default
#     128K, --depth 4) of it for --seconds, alone; then again in a new
#     connection while VM B reads every 1 MiB block of `cold.dat` once
#     (depth 16, scattered), which the caches have never seen;
#   - standalone: each serve has a --cache-size (default 256M) memory cache
#     of its own; host: the host daemon has one --cache-size cache with
#     `--vm-cache-share 50` (neither VM may hold more than half), each
#     serve --host 64M of its own;
#   - prints per setup VM A's p50/p99 alone and beside the stream, the
#     ratio of the p99s (issue 32's goal: at most 2x) and VM B's GB/s.
#
# Usage: benches/vs-fairness.sh [--seconds S] [--block-size SIZE] [--hot-size SIZE]
#                               [--cold-size SIZE] [--cache-size SIZE] [--s3]
#                               [--sluice PATH] [--keep]
#
# Without --sluice it builds the release binary. Run as root or not (as root
# the daemons sandbox themselves as `nobody`). On a host with few cores the
# two VMs' harnesses and daemons share them: the standalone line shows what
# sharing the CPUs alone costs. Compare figures within one run only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=5
block_size=128K
hot_size=64M
cold_size=512M
cache_size=256M
sluice=
keep=0
s3=0
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=${2:?}; shift 2 ;;
    --block-size) block_size=${2:?}; shift 2 ;;
    --hot-size) hot_size=${2:?}; shift 2 ;;
    --cold-size) cold_size=${2:?}; shift 2 ;;
    --cache-size) cache_size=${2:?}; shift 2 ;;
    --sluice) sluice=${2:?}; shift 2 ;;
    --s3) s3=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$sluice" ]; then
    (cd "$repo" && cargo build --release --quiet --bin sluice)
    sluice=$repo/target/release/sluice
fi
work=$(mktemp -d /var/tmp/sluice-vs-fairness.XXXXXX)
chmod 0755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
meta="sqlite3://$work/meta.db"
if [ "$s3" = 1 ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    moto_server -p "$port" >"$work/s3.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do curl -s "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
    "$sluice" format "$meta" bench --storage s3 --bucket "http://127.0.0.1:$port/bench" \
        --access-key bench --secret-key bench >/dev/null
else
    "$sluice" format "$meta" bench --bucket "$work/objects" >/dev/null
fi

wait_socket() {
    for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "no socket $1; see its log" >&2
    exit 1
}
# One field of a harness report (`--json`): FIELD is a jq-like path of
# plain keys, e.g. latency.p99.
field() {
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[k]
print(v)' "$1" "$2"
}

# The data set: written once through a standalone daemon.
"$sluice" serve "$meta" --socket "$work/writer.sock" --no-pin --no-metrics >"$work/writer.log" 2>&1 &
writer=$!
pids+=($writer)
wait_socket "$work/writer.sock"
for f in hot:"$hot_size" cold:"$cold_size"; do
    "$sluice" bench virtiofs --socket "$work/writer.sock" --file "${f%%:*}.dat" \
        --file-size "${f#*:}" --seconds 1 >/dev/null 2>&1
done
kill -TERM "$writer"
wait "$writer" 2>/dev/null || true

echo "sluice ($("$sluice" --version)); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "VM A: random $block_size READs (depth 4) of a cached $hot_size file; VM B: streams $cold_size never read"
printf '\n%-10s %12s %12s %12s %12s %10s %10s\n' setup "alone p50us" "alone p99us" "busy p50us" "busy p99us" "p99 ratio" "B GB/s"

# VM A's measured pass (warming first, in the same connection).
vm_a() {
    "$sluice" bench virtiofs --socket "$work/a.sock" --file hot.dat --block-size "$block_size" \
        --depth 4 --seconds "$seconds" --warm-first --json >"$1" 2>"$1.err"
}

for setup in standalone host; do
    daemons=()
    if [ "$setup" = host ]; then
        "$sluice" host "$meta" --control "$work/vol.host" --cache-size "$cache_size" \
            --vm-cache-share 50 --no-metrics >"$work/host.log" 2>&1 &
        pids+=($!)
        daemons+=($!)
        wait_socket "$work/vol.host"
    fi
    for vm in a b; do
        args=(--cache-size "$cache_size")
        [ "$setup" = host ] && args=(--cache-size 64M --host "$work/vol.host")
        "$sluice" serve "$meta" --socket "$work/$vm.sock" --no-pin --no-metrics \
            "${args[@]}" >"$work/$vm.log" 2>&1 &
        pids+=($!)
        daemons+=($!)
        wait_socket "$work/$vm.sock"
        if [ "$setup" = host ]; then
            for _ in $(seq 200); do grep -q 'attached to the host daemon' "$work/$vm.log" && break; sleep 0.05; done
        fi
    done
    vm_a "$work/$setup-alone.json"
    # VM B streams from before VM A's pass (its warming included) to past
    # its end; it reports its own rate over its whole run.
    "$sluice" bench virtiofs --socket "$work/b.sock" --file cold.dat --block-size 1M --depth 16 \
        --pattern once --seconds $((seconds + 8)) --json >"$work/$setup-b.json" 2>"$work/$setup-b.err" &
    stream=$!
    sleep 1
    vm_a "$work/$setup-busy.json"
    stream_alive=0
    kill -0 "$stream" 2>/dev/null && stream_alive=1
    wait "$stream" 2>/dev/null || true
    a50=$(field "$work/$setup-alone.json" latency.p50)
    a99=$(field "$work/$setup-alone.json" latency.p99)
    b50=$(field "$work/$setup-busy.json" latency.p50)
    b99=$(field "$work/$setup-busy.json" latency.p99)
    bgbs=$(field "$work/$setup-b.json" gb_per_s 2>/dev/null || echo 0)
    awk -v s="$setup" -v a50="$a50" -v a99="$a99" -v b50="$b50" -v b99="$b99" -v g="$bgbs" \
        'BEGIN { printf "%-10s %12.0f %12.0f %12.0f %12.0f %9.2fx %10.3f\n", s, a50, a99, b50, b99, b99 / a99, g }'
    [ "$stream_alive" = 1 ] || echo "  (VM B's stream ended before VM A's pass did: raise --cold-size)"
    for d in "${daemons[@]}"; do kill -TERM "$d" 2>/dev/null || true; done
    for d in "${daemons[@]}"; do wait "$d" 2>/dev/null || true; done
    rm -f "$work"/a.sock "$work"/b.sock "$work/vol.host"
done

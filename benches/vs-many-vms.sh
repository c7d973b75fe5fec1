#!/usr/bin/env bash
# N VMs reading one data set: N standalone `sluice serve` against one
# `sluice host` with N `sluice serve --host`, side by side in one run,
# each VM driven by the virtio-fs driver harness (`sluice bench virtiofs`).
#
#   - one volume (SQLite + a file:// directory on this disk, or with --s3
#     a local S3 server: `moto_server`, which must be installed), one file
#     of --file-size written once through the harness;
#   - for each N in --vms (default "1 2 4") and each setup: fresh daemons
#     (empty memory caches, no disk cache), then N harness VMs at once read
#     every 1 MiB block of the file once in a scattered order ("cold"),
#     then, each in one new connection, the file in order and random 1 MiB
#     blocks for --seconds ("warm");
#   - standalone: each serve has a --cache-size memory cache of its own
#     (default 1G); host: the host daemon has that cache, each serve --host
#     64M of its own (what it would use while the host is away);
#   - prints, per pass, the aggregate GB/s of the N VMs, the bytes all
#     daemons fetched from the object store in it
#     (juicefs_object_request_data_bytes{method="GET"} of every daemon), the
#     most block-cache memory they held while it ran (standalone:
#     sluice_memcache_bytes summed over the serves, a cache that lives as
#     long as its VM connection; host: sluice_host_memory_bytes, which
#     outlives them, plus the servers' own), and the daemons' CPU-seconds
#     per GB delivered (utime + stime of every daemon over the pass).
#
# On a file:// volume a standalone server reads a random READ's block
# straight from its object file (no GET, the kernel's page cache shared by
# all), so "fetched" compares only with --s3, where every server GETs.
#
# Usage: benches/vs-many-vms.sh [--vms "1 2 4"] [--file-size SIZE] [--seconds S]
#                               [--cache-size SIZE] [--s3] [--sluice PATH] [--keep]
#
# Without --sluice it builds the release binary. Run as root or not (as root
# the daemons sandbox themselves as `nobody`). Compare figures within one
# run only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
vms="1 2 4"
file_size=512M
seconds=5
cache_size=1G
sluice=
keep=0
s3=0
while [ $# -gt 0 ]; do
    case "$1" in
    --vms) vms=${2:?}; shift 2 ;;
    --file-size) file_size=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
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
work=$(mktemp -d /var/tmp/sluice-vs-many-vms.XXXXXX)
chmod 0755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
meta="sqlite3://$work/meta.db"
file_bytes=$(numfmt --from=iec "$file_size")
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
# A daemon's metrics address, from its log.
metrics_of() {
    local log=$1
    for _ in $(seq 400); do
        grep -q 'metrics on http://' "$log" && break
        sleep 0.05
    done
    grep -o 'metrics on http://[^/]*' "$log" | head -n 1 | sed 's|metrics on http://||'
}
# The sum of a metric's series (lines starting with NAME, containing WITH).
metric() {
    local addr=$1 name=$2 with=${3:-}
    curl -s "http://$addr/metrics" | { grep "^$name" || true; } | { grep -F -- "$with" || true; } |
        awk '{ s += $NF } END { printf "%.0f\n", s }'
}
tick=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The data set: written once through a standalone daemon.
"$sluice" serve "$meta" --socket "$work/writer.sock" --no-pin --no-metrics >"$work/writer.log" 2>&1 &
writer=$!
pids+=($writer)
wait_socket "$work/writer.sock"
"$sluice" bench virtiofs --socket "$work/writer.sock" --file bench.dat --file-size "$file_size" \
    --seconds 1 >/dev/null
kill -TERM "$writer"
wait "$writer" 2>/dev/null || true

echo "sluice ($("$sluice" --version)); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); data set $file_size"
printf '\n%-3s %-10s %-5s %10s %12s %12s %10s\n' N setup pass GB/s "fetched MiB" "cache MiB" CPU-s/GB

# The block-cache memory all daemons hold now (standalone: each serve's
# memory cache, which lives as long as its VM connection; host: the host's
# memory table, and what the servers hold of their own).
cache_now() {
    local a sum=0
    for a in "${addrs[@]}"; do
        sum=$((sum + $(metric "$a" sluice_host_memory_bytes) + $(metric "$a" 'sluice_memcache_bytes{')))
    done
    echo "$sum"
}
any_alive() {
    local p
    for p; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}
# One pass of N VMs at once (one connection each); sets gbs (aggregate
# GB/s) and peak (the most block-cache memory seen while it ran).
pass() {
    local n=$1 i g benches=()
    shift
    for i in $(seq "$n"); do
        "$sluice" bench virtiofs --socket "$work/vm$i.sock" --file bench.dat --block-size 1M \
            --depth 16 --seconds "$seconds" "$@" >"$work/bench$i.out" 2>&1 &
        benches+=($!)
    done
    peak=0
    while any_alive "${benches[@]}"; do
        c=$(cache_now)
        [ "$c" -gt "$peak" ] && peak=$c
        sleep 0.2
    done
    wait "${benches[@]}"
    c=$(cache_now)
    [ "$c" -gt "$peak" ] && peak=$c
    gbs=0
    for i in $(seq "$n"); do
        g=$(grep -oE '[0-9.]+ GB/s' "$work/bench$i.out" | head -n 1 | cut -d' ' -f1)
        gbs=$(awk -v a="$gbs" -v b="${g:-0}" 'BEGIN { print a + b }')
    done
}

for n in $vms; do
    for setup in standalone host; do
        daemons=()
        addrs=()
        if [ "$setup" = host ]; then
            "$sluice" host "$meta" --control "$work/vol.host" --cache-size "$cache_size" \
                --metrics 127.0.0.1:0 >"$work/host.log" 2>&1 &
            pids+=($!)
            daemons+=($!)
            wait_socket "$work/vol.host"
            addrs+=("$(metrics_of "$work/host.log")")
        fi
        for i in $(seq "$n"); do
            args=(--cache-size "$cache_size")
            [ "$setup" = host ] && args=(--cache-size 64M --host "$work/vol.host")
            "$sluice" serve "$meta" --socket "$work/vm$i.sock" --no-pin --metrics 127.0.0.1:0 \
                "${args[@]}" >"$work/vm$i.log" 2>&1 &
            pids+=($!)
            daemons+=($!)
            wait_socket "$work/vm$i.sock"
            addrs+=("$(metrics_of "$work/vm$i.log")")
        done
        if [ "$setup" = host ]; then
            for i in $(seq "$n"); do
                for _ in $(seq 200); do grep -q 'attached to the host daemon' "$work/vm$i.log" && break; sleep 0.05; done
            done
        fi
        for p in cold warm; do
            before=0
            for d in "${daemons[@]}"; do before=$((before + $(cpu_ticks "$d"))); done
            fetched_before=0
            for a in "${addrs[@]}"; do
                fetched_before=$((fetched_before + $(metric "$a" juicefs_object_request_data_bytes 'method="GET"')))
            done
            # Cold: every block once, scattered. Warm: one in-order pass
            # (in the same connection, so a standalone server's cache holds
            # it), then random blocks for --seconds.
            if [ "$p" = cold ]; then pass "$n" --pattern once; else pass "$n" --warm-first; fi
            after=0
            for d in "${daemons[@]}"; do after=$((after + $(cpu_ticks "$d"))); done
            fetched=0
            for a in "${addrs[@]}"; do
                fetched=$((fetched + $(metric "$a" juicefs_object_request_data_bytes 'method="GET"')))
            done
            # GB delivered: the cold pass reads the file once per VM; the
            # warm pass for --seconds at the measured rate (its in-order
            # pass not counted, its CPU is).
            awk -v n="$n" -v s="$setup" -v p="$p" -v g="$gbs" -v f=$((fetched - fetched_before)) -v c="$peak" \
                -v t=$((after - before)) -v hz="$tick" -v secs="$seconds" -v size="$file_bytes" \
                'BEGIN { gb = (p == "cold" ? n * size / 1e9 : g * secs); printf "%-3s %-10s %-5s %10.3f %12.0f %12.0f %10.4f\n",
                         n, s, p, g, f / 1048576, c / 1048576, (gb > 0 ? t / hz / gb : 0) }'
        done
        for d in "${daemons[@]}"; do kill -TERM "$d" 2>/dev/null || true; done
        for d in "${daemons[@]}"; do wait "$d" 2>/dev/null || true; done
        rm -f "$work"/vm*.sock "$work/vol.host"
    done
done

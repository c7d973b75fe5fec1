#!/usr/bin/env bash
# A mount on a Redis + S3 volume against the raw speed of its two backends, side by side:
#   - a cold sequential read of a big file (a fresh mount: sluice's memory cache is empty)
#     against `sluice objbench` GET throughput of 4 MiB objects on the same S3 server;
#   - stat of many files (a fresh mount: the kernel has no entry or attribute cached, so
#     each stat is one lookup in Redis) against `redis-benchmark -t get` on the same
#     redis-server (its default 50 connections, and 1 connection like one stat loop).
# Prints one table: line, sluice, reference, ratio. Goal: >= 0.9x on the read line.
#
# The S3 server is the loopback one of the tests (engine/examples/s3_server.rs, s3s-fs
# over a directory); Redis is a private redis-server on a free port, saving nothing.
# The bucket's files stay in the page cache for both readers (nothing is dropped).
#
# Usage: benches/vs-objbench.sh [--quick] [--debug] [--dir DIR] [--keep]
#   --quick   256 MiB and 2,000 files (a check that everything runs, not a measurement)
#   --debug   use the debug build (target/debug) instead of building release
#   --dir     work directory (default /var/tmp/sluice-vs-objbench)
#   --keep    leave the work directory behind
# Needs root (FUSE mounts), redis-server and redis-benchmark.
set -euo pipefail

work=/var/tmp/sluice-vs-objbench
quick=0
profile=release
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --debug) profile=debug ;;
        --dir) work="$2"; shift ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$(id -u)" != 0 ]; then
    echo "vs-objbench.sh needs root (FUSE mounts)" >&2
    exit 1
fi
for bin in redis-server redis-benchmark python3; do
    command -v "$bin" >/dev/null || { echo "$bin is missing (apt-get install redis-server python3)" >&2; exit 1; }
done

if [ "$quick" = 1 ]; then
    big_mib=256; files=2000
else
    big_mib=1024; files=10000
fi

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(realpath -m "$work")"
build=(-p sluice --bin sluice -p sluice-engine --example s3_server
    --features sluice-engine/s3-test-server)
echo "== building sluice and the loopback S3 server ($profile)"
if [ "$profile" = release ]; then
    (cd "$repo" && cargo build --release "${build[@]}")
else
    (cd "$repo" && cargo build "${build[@]}")
fi
sluice="$repo/target/$profile/sluice"
s3_server="$repo/target/$profile/examples/s3_server"

ak=bench-access
sk=bench-secret
pids=()
cleanup() {
    set +e
    for m in "$work/mnt"; do
        if mountpoint -q "$m"; then "$sluice" umount "$m" || umount -l "$m"; fi
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    if [ "$keep" = 0 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$work"
mkdir -p "$work/mnt" "$work/s3" "$work/redis"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --save "" \
    --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
S3_ACCESS_KEY=$ak S3_SECRET_KEY=$sk "$s3_server" "$work/s3" >"$work/s3.url" 2>"$work/s3.log" &
pids+=($!)
for _ in $(seq 100); do
    [ -s "$work/s3.url" ] && redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done
s3="$(head -1 "$work/s3.url")"
meta="redis://127.0.0.1:$port/1"
echo "== Redis $meta, S3 $s3 (work dir $work)"

"$sluice" format "$meta" bench --storage s3 --bucket "$s3/bench" --access-key "$ak" \
    --secret-key "$sk" --compress none --trash-days 0 >/dev/null

smount() { # extra mount options...
    "$sluice" mount "$meta" "$work/mnt" -d --log "$work/mount.log" "$@" >&2
}
sumount() {
    "$sluice" umount "$work/mnt" >&2
}
now() { date +%s.%N; }

echo "== writing a $big_mib MiB file"
smount
head -c "${big_mib}M" /dev/urandom >"$work/mnt/big"
sumount

echo "== cold sequential read through a fresh mount"
smount
t0=$(now)
dd if="$work/mnt/big" of=/dev/null bs=1M status=none
t1=$(now)
read_mibs=$(python3 -c "print(f'{$big_mib/($t1-$t0):.1f}')")
sumount

echo "== sluice objbench on the same S3 server"
objbench() { # threads
    "$sluice" objbench --storage s3 --bucket "$s3/objbench" --access-key "$ak" \
        --secret-key "$sk" --threads "$1" --big-size 4M --big-count 128 --count 10 \
        | tee -a "$work/objbench.txt" \
        | awk -F'|' '/download objects/ { for (i = 1; i <= NF; i++) if ($i ~ /MiB\/s/) { gsub(/[^0-9.]/, "", $i); print $i } }'
}
get1=$(objbench 1)
get4=$(objbench 4)

echo "== creating $files files"
smount
python3 - "$work/mnt/small" "$files" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
for i in range(n):
    os.close(os.open(f"{d}/f{i:05}", os.O_CREAT | os.O_WRONLY, 0o644))
EOF
sumount

echo "== stat of $files files through a fresh mount"
stat_rate() { # threads
    smount
    python3 - "$work/mnt/small" "$files" "$1" <<'EOF'
import os, sys, threading, time
d, n, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = [f"{d}/f{i:05}" for i in range(n)]
def run(part):
    for p in part:
        os.stat(p)
parts = [names[i::t] for i in range(t)]
threads = [threading.Thread(target=run, args=(p,)) for p in parts]
t0 = time.perf_counter()
for th in threads: th.start()
for th in threads: th.join()
print(f"{n / (time.perf_counter() - t0):.0f}")
EOF
    sumount
}
stat1=$(stat_rate 1)
stat8=$(stat_rate 8)

echo "== redis-benchmark on the same redis-server"
rb() { # clients
    redis-benchmark -p "$port" -t get -n 100000 -q -c "$1" \
        | tr '\r' '\n' | awk '/^GET:/ { print $2 }' | tail -1
}
get_c50=$(rb 50)
get_c1=$(rb 1)

echo
echo "sluice ($profile build) on Redis + loopback S3: ${big_mib} MiB file, $files files"
python3 - "$read_mibs" "$get1" "$get4" "$stat1" "$stat8" "$get_c1" "$get_c50" <<'EOF'
import sys
read, get1, get4, stat1, stat8, c1, c50 = map(float, sys.argv[1:])
rows = [
    ("cold sequential read (MiB/s) vs objbench GET, 1 thread", read, get1),
    ("cold sequential read (MiB/s) vs objbench GET, 4 threads", read, get4),
    ("stat, 1 thread (ops/s) vs redis GET, 1 client", stat1, c1),
    ("stat, 8 threads (ops/s) vs redis GET, 50 clients", stat8, c50),
    ("stat, 1 thread (ops/s) vs redis GET, 50 clients", stat1, c50),
]
w = max(len(r[0]) for r in rows)
print(f"{'line':<{w}}  {'sluice':>10}  {'reference':>10}  {'ratio':>6}")
for name, ours, ref in rows:
    print(f"{name:<{w}}  {ours:>10.1f}  {ref:>10.1f}  {ours / ref:>5.2f}x")
EOF

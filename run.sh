#!/usr/bin/env bash
# sluice's main job on the embedded defaults (SQLite metadata + a local
# directory for objects), end to end on this host:
#   build sluice, format a volume, mount it through FUSE, generate a small
#   ResNet-50-style training data set, copy it in, read it back (SHA-256
#   compared, MiB/s printed), run one emulated H100 over it, unmount.
# Usage: ./run.sh [WORKDIR]     (default /var/tmp/sluice-demo)
# Needs root (FUSE mounts) and a Rust toolchain (cargo).
set -euo pipefail
cd "$(dirname "$0")"
work=${1:-/var/tmp/sluice-demo}
say() { printf '\n== %s\n' "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "run.sh: mounting needs root; run it with sudo" >&2; exit 1; }
command -v cargo >/dev/null || { echo "run.sh: cargo not found; install Rust (https://rustup.rs) and rerun" >&2; exit 1; }
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || { echo "run.sh: /dev/fuse is missing; load the fuse module (modprobe fuse)" >&2; exit 1; }

say "building sluice (release)"
cargo build --release --quiet
sluice=$PWD/target/release/sluice

mnt=$work/mnt
cleanup() {
    if grep -qs " $mnt fuse.sluice " /proc/mounts; then "$sluice" umount "$mnt" || "$sluice" umount --lazy "$mnt"; fi
}
trap cleanup EXIT
cleanup
rm -rf "$work"
mkdir -p "$mnt"

say "formatting volume 'demo': metadata sqlite3://$work/meta.db, objects in $work/objects"
"$sluice" format "sqlite3://$work/meta.db" demo --bucket "$work/objects"

say "mounting on $mnt"
"$sluice" mount --background --log "$work/mount.log" "sqlite3://$work/meta.db" "$mnt"

say "generating a ResNet-50-style data set (16 files x 64 samples x 112 KiB) in $work/source"
mkdir -p "$work/source"
"$sluice" bench mlperf datagen --workload resnet50 --files 16 --samples-per-file 64 \
    --data-dir "$work/source" --no-progress

say "copying it into the volume"
t0=$(date +%s%N)
cp -r "$work/source" "$mnt/dataset"
sync
t1=$(date +%s%N)
bytes=$(du -sb "$work/source" | cut -f1)
awk -v b="$bytes" -v s="$(( (t1 - t0) / 1000000 ))" 'BEGIN { s /= 1000; printf "wrote %.1f MiB in %.2f s: %.1f MiB/s\n", b/1048576, s, b/1048576/s }'

say "reading it back through the mount (page cache dropped)"
echo 3 > /proc/sys/vm/drop_caches
t0=$(date +%s%N)
(cd "$mnt/dataset" && find . -type f | sort | xargs sha256sum) > "$work/mount.sha256"
t1=$(date +%s%N)
(cd "$work/source" && find . -type f | sort | xargs sha256sum) > "$work/source.sha256"
awk -v b="$bytes" -v s="$(( (t1 - t0) / 1000000 ))" 'BEGIN { s /= 1000; printf "read and hashed %.1f MiB in %.2f s: %.1f MiB/s\n", b/1048576, s, b/1048576/s }'
if cmp -s "$work/mount.sha256" "$work/source.sha256"; then
    echo "all $(wc -l < "$work/source.sha256") files read back equal (SHA-256)"
else
    echo "MISMATCH between source and volume:" >&2
    diff "$work/source.sha256" "$work/mount.sha256" >&2 || true
    exit 1
fi

say "one emulated H100 training ResNet-50 from the volume (MLPerf Storage AU)"
"$sluice" bench mlperf run --workload resnet50 --accelerator h100 --accelerators 1 \
    --files 16 --samples-per-file 64 --epochs 2 --data-dir "$mnt/dataset" \
    --output-dir "$work/results" --no-progress

say "what the volume holds"
"$sluice" info "$mnt/dataset/$(cd "$mnt/dataset" && find . -type f | sort | head -1)" | head -8

say "unmounting"
"$sluice" umount "$mnt"
trap - EXIT
echo "done: volume files in $work (metadata meta.db, objects under objects/demo/chunks)"

#!/usr/bin/env bash
# sluice's main job on the embedded defaults (SQLite metadata + a local
# directory for objects), end to end on this host:
#   build sluice, format a volume, mount it through FUSE, generate a small
#   ResNet-50-style training data set, copy it in, read it back (SHA-256
#   compared, MiB/s printed), run one emulated H100 over it, unmount; then
#   serve the volume over virtio-fs (`sluice serve`, two request queues),
#   boot a real Linux guest under QEMU (installed when missing) that mounts
#   it and reads the whole data set, and compare what the guest read.
# Usage: ./run.sh [WORKDIR]     (default /var/tmp/sluice-demo)
# Needs root (FUSE mounts, apt-get) and a Rust toolchain (cargo).
# SLUICE_SKIP_VM=1 stops after the host part.
set -euo pipefail
cd "$(dirname "$0")"
export LC_ALL=C
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

if [ "${SLUICE_SKIP_VM:-0}" = 1 ]; then
    trap - EXIT
    echo "done (SLUICE_SKIP_VM=1: no guest): volume files in $work"
    exit 0
fi

say "building the guest: Debian's 6.12 cloud kernel + a busybox initramfs (vm-images/build.sh)"
# shellcheck source=vm-images/apt.sh
. vm-images/apt.sh
need_command qemu-system-x86_64 qemu-system-x86
vm-images/build.sh

say "serving the volume over virtio-fs: sluice serve --queues 2 (read-only, dataset/ only)"
socket=$work/vhost-fs.sock
"$sluice" serve "sqlite3://$work/meta.db" --socket "$socket" --queues 2 --once \
    --export dataset --read-only >"$work/serve.log" 2>&1 &
serve_pid=$!
cleanup_all() {
    kill "$serve_pid" 2>/dev/null || true
    cleanup
}
trap cleanup_all EXIT
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
[ -S "$socket" ] || { cat "$work/serve.log" >&2; echo "run.sh: sluice serve did not start" >&2; exit 1; }
sed -n '1,/^$/p' "$work/serve.log" | head -n 20

cat >"$work/guest.sh" <<'GUEST'
set -e
start=$(cut -d' ' -f1 /proc/uptime)
find . -type f | sort | while read -r f; do echo "SUM $(sha256sum "$f")"; done
end=$(cut -d' ' -f1 /proc/uptime)
files=$(find . -type f | wc -l)
bytes=$(find . -type f -exec cat {} + | wc -c)
echo "GUEST read $files files, $bytes bytes in $start..$end s"
GUEST
say "booting the guest (QEMU; KVM when it works here, else TCG): it mounts virtio-fs and reads the data set"
vm-images/run-vm.sh --socket "$socket" --queues 2 --script "$work/guest.sh" \
    --timeout 900 --log "$work/console.log" >/dev/null
wait "$serve_pid" || true
tr -d '\r' <"$work/console.log" | sed -n 's/^SUM \([0-9a-f]*\)  \.\/\(.*\)$/\1  .\/\2/p' >"$work/guest.sha256"
line=$(tr -d '\r' <"$work/console.log" | grep '^GUEST read' | tail -n 1)
echo "$line" | awk '{ split($8, t, /\.\./); s = t[2] - t[1]; if (s <= 0) s = 0.01;
    printf "the guest read %d files, %.1f MiB in %.2f s over virtio-fs: %.1f MiB/s\n", $3, $5/1048576, s, $5/1048576/s }'
grep -E "queue [0-9]+: " "$work/serve.log" | sed 's/^.*\] //'
if cmp -s "$work/guest.sha256" "$work/source.sha256"; then
    echo "all $(wc -l < "$work/guest.sha256") files read in the guest equal the source (SHA-256)"
else
    echo "MISMATCH between the source and what the guest read:" >&2
    diff "$work/source.sha256" "$work/guest.sha256" >&2 || true
    exit 1
fi
trap - EXIT
echo "done: volume files in $work (metadata meta.db, objects under objects/demo/chunks, guest console console.log)"

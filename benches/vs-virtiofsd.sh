#!/usr/bin/env bash
# sluice serve vs virtiofsd, side by side in one run, through the host-side
# virtio-fs driver harness (`sluice bench virtiofs`), which plays the guest:
# shared memfd memory, split virtqueues, FUSE INIT/LOOKUP/OPEN/READ.
#
#   - sluice serves a SQLite + local-directory volume; virtiofsd shares a
#     tmpfs directory. Each gets the same file, written through its own
#     socket by the harness, and is read once before measuring (warm cache).
#   - 1 MiB reads, one queue: GB/s of each, the ratio, and single-core
#     memcpy of 1 MiB in the same run (the "one copy per byte" bound).
#   - 4 KiB reads at depth 32: virtiofsd with its one queue, sluice with one
#     and with two queues.
#
# Usage: benches/vs-virtiofsd.sh [--seconds S] [--file-size SIZE] [--keep]
# Needs root. virtiofsd: $VIRTIOFSD, .tools/bin/virtiofsd (cargo install
# virtiofsd --root .tools), /usr/libexec/virtiofsd or /usr/lib/qemu/virtiofsd.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=10
file_size=256M
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=${2:?}; shift 2 ;;
    --file-size) file_size=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

vfsd=
for c in "${VIRTIOFSD:-}" "$repo/.tools/bin/virtiofsd" /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd; do
    if [ -n "$c" ] && [ -x "$c" ]; then vfsd=$c; break; fi
done
[ -n "$vfsd" ] || { echo "no virtiofsd found: set VIRTIOFSD=PATH" >&2; exit 1; }

(cd "$repo" && cargo build --release --quiet --bin sluice)
sluice=$repo/target/release/sluice
work=$(mktemp -d /var/tmp/sluice-vs-virtiofsd.XXXXXX)
share=$(mktemp -d /dev/shm/sluice-vs-virtiofsd.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$share"
    if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

wait_socket() {
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "no socket at $1; logs in $work" >&2
    exit 1
}

"$sluice" format "sqlite3://$work/meta.db" bench --bucket "$work/objects" >/dev/null
"$sluice" serve "sqlite3://$work/meta.db" --socket "$work/sluice.sock" --queues 2 \
    >"$work/serve.log" 2>&1 &
pids+=($!)
# virtiofsd serves one connection and exits: start a fresh one per run.
start_virtiofsd() {
    rm -f "$work/virtiofsd.sock"
    if "$vfsd" --help 2>&1 | grep -q -- '--shared-dir'; then
        "$vfsd" --socket-path "$work/virtiofsd.sock" --shared-dir "$share" --cache auto \
            --sandbox none >>"$work/virtiofsd.log" 2>&1 &
    else
        "$vfsd" --socket-path="$work/virtiofsd.sock" -o source="$share" -o cache=auto \
            -o sandbox=chroot >>"$work/virtiofsd.log" 2>&1 &
    fi
    pids+=($!)
    wait_socket "$work/virtiofsd.sock"
}
wait_socket "$work/sluice.sock"

bench() { "$sluice" bench virtiofs --file-size "$file_size" "$@"; }
echo "sluice serve ($("$sluice" --version)) vs virtiofsd ($("$vfsd" --version 2>&1 | head -n 1)); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
# The same file on both: the harness creates it in the sluice volume (and a
# short first run warms sluice's cache); virtiofsd's copy sits in tmpfs.
bench --socket "$work/sluice.sock" --seconds 2 >/dev/null
head -c "$(numfmt --from=iec "$file_size")" /dev/urandom >"$share/sluice-virtiofs-bench.dat"

echo
echo "== 1 MiB reads, depth 16, one queue each (with single-core memcpy)"
start_virtiofsd
bench --socket "$work/sluice.sock" --vs-socket "$work/virtiofsd.sock" --seconds "$seconds" \
    --queues 1 --block-size 1M --depth 16 --vs-memcpy
echo
echo "== 4 KiB reads, depth 32, one queue each"
start_virtiofsd
bench --socket "$work/sluice.sock" --vs-socket "$work/virtiofsd.sock" --seconds "$seconds" \
    --queues 1 --block-size 4K --depth 32
echo
echo "== 4 KiB reads, depth 32: sluice with two queues (virtiofsd takes one)"
bench --socket "$work/sluice.sock" --seconds "$seconds" --queues 2 --block-size 4K --depth 32
echo
echo "== 1 MiB reads, depth 16: sluice with two queues"
bench --socket "$work/sluice.sock" --seconds "$seconds" --queues 2 --block-size 1M --depth 16 --vs-memcpy

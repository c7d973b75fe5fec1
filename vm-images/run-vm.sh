#!/usr/bin/env bash
# Boots the sluice test guest under QEMU with a vhost-user-fs device on a
# backend's socket (sluice serve, or virtiofsd), runs a script in the guest
# and exits with the script's exit status.
#
# Usage: vm-images/run-vm.sh [--socket PATH] [options]
#
#   --socket PATH      vhost-user socket of the virtio-fs backend; without it
#                      the guest boots with no file system device
#   --tag TAG          virtio-fs tag (default sluice)
#   --mnt DIR          mount point in the guest (default /data)
#   --queues N         virtio-fs request queues (default 1; virtiofsd takes 1)
#   --queue-size N     descriptors per queue, a power of two <= 1024 (default 1024)
#   --mem SIZE         guest memory, e.g. 1G or 512M (default 1G)
#   --cpus N           vCPUs (default 2)
#   --host-node N      bind guest memory to host NUMA node N (the node of the
#                      backend's workers)
#   --script PATH      host shell script to run in the guest (copied in
#                      through the initramfs)
#   --guest-script P   script path inside the guest instead (relative: inside
#                      the mount)
#   --timeout SECS     kill the guest after SECS seconds (default 300)
#   --accel A          auto (default; KVM when vm-images/kvm-probe.sh says it
#                      works, else TCG), kvm or tcg. Env SLUICE_ACCEL sets it too.
#   --kernel PATH      guest kernel (default vm-images/out/vmlinux, else vmlinuz)
#   --initrd PATH      guest initramfs (default vm-images/out/initramfs.cpio.gz)
#   --append ARGS      extra kernel command line arguments
#   --disk IMG         a raw disk image as a virtio-blk disk (repeatable; the
#                      guest sees them as /dev/vda, /dev/vdb, ... in the order
#                      given, --disk-ro ones included). cache=none: the
#                      guest's flushes reach the image, and what it had not
#                      flushed is lost when QEMU is killed, as on a power
#                      loss (cache=writeback where the image's file system
#                      has no O_DIRECT: the same for a killed QEMU)
#   --disk-ro IMG      the same, read-only
#   --pidfile FILE     QEMU writes its process id there (to kill it)
#   --log FILE         also write the guest console to FILE
#   --shell            open a shell in the guest after the script
#
# Exit status: the guest script's status (parsed from its
# "SLUICE-GUEST-EXIT rc=N" console line; 253: mount failed, 254: script
# missing); 124 when the timeout hit first; 125 when QEMU ended without the
# marker (QEMU error, guest crash); 137 when QEMU was killed from outside
# (SIGKILL, as a power-loss test does); 2 for bad arguments.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vm-images/apt.sh
. "$here/apt.sh"
trap 'say "error: line $LINENO failed: $BASH_COMMAND"' ERR

socket=
tag=sluice
mnt=/data
queues=1
queue_size=1024
mem=1G
cpus=2
host_node=
script=
guest_script=
timeout_s=300
accel=${SLUICE_ACCEL:-auto}
# The uncompressed kernel boots faster (PVH); build.sh writes both.
kernel=$here/out/vmlinux
[ -s "$kernel" ] || kernel=$here/out/vmlinuz
initrd=$here/out/initramfs.cpio.gz
extra_append=
disks=()
pidfile=
log=
shell=0

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

# Exits with status 2 and a one-line reason for a bad argument.
bad_arg() {
    say "error: $*"
    exit 2
}

while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || case "$1" in --shell | -h | --help) ;; *) bad_arg "$1 needs a value" ;; esac
    case "$1" in
    --socket) socket=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --mnt) mnt=$2; shift 2 ;;
    --queues) queues=$2; shift 2 ;;
    --queue-size) queue_size=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --host-node) host_node=$2; shift 2 ;;
    --script) script=$2; shift 2 ;;
    --guest-script) guest_script=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --initrd) initrd=$2; shift 2 ;;
    --append) extra_append=$2; shift 2 ;;
    --disk) disks+=("rw:$2"); shift 2 ;;
    --disk-ro) disks+=("ro:$2"); shift 2 ;;
    --pidfile) pidfile=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --shell) shell=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) bad_arg "unknown argument '$1' (see --help)" ;;
    esac
done

is_count() { [[ "$1" =~ ^[1-9][0-9]{0,4}$ ]]; }
if ! is_count "$queues" || [ "$queues" -gt 1023 ]; then
    bad_arg "--queues must be 1..1023, not '$queues'"
fi
if ! is_count "$queue_size" || [ "$queue_size" -gt 1024 ] || [ $((queue_size & (queue_size - 1))) -ne 0 ]; then
    bad_arg "--queue-size must be a power of two up to 1024, not '$queue_size'"
fi
if ! is_count "$cpus" || [ "$cpus" -gt 288 ]; then
    bad_arg "--cpus must be 1..288, not '$cpus'"
fi
is_count "$timeout_s" || bad_arg "--timeout must be a whole number of seconds, not '$timeout_s'"
[[ "$mem" =~ ^[1-9][0-9]*[MG]$ ]] || bad_arg "--mem must look like 512M or 2G, not '$mem'"
[ -z "$host_node" ] || [[ "$host_node" =~ ^[0-9]+$ ]] || bad_arg "--host-node must be a node number, not '$host_node'"
[[ "$tag" =~ ^[A-Za-z0-9._-]{1,36}$ ]] || bad_arg "--tag must be 1-36 letters, digits, '.', '_' or '-', not '$tag'"
[[ "$mnt" =~ ^/[A-Za-z0-9._/-]*$ ]] || bad_arg "--mnt must be an absolute path without spaces, not '$mnt'"
[[ "$guest_script" =~ ^[A-Za-z0-9._/-]*$ ]] || bad_arg "--guest-script must be a path without spaces, not '$guest_script'"
[ -z "$script" ] || [ -z "$guest_script" ] || bad_arg "give --script or --guest-script, not both"
[ -z "$script" ] || [ -f "$script" ] || bad_arg "--script $script is not a file"
[ -z "$socket" ] || [ -S "$socket" ] || bad_arg "--socket $socket is not a socket; start the backend (sluice serve, virtiofsd) first"
for d in "${disks[@]}"; do
    [ -f "${d#*:}" ] || bad_arg "disk image ${d#*:} is not a file"
    [[ "${d#*:}" != *,* ]] || bad_arg "disk image ${d#*:}: QEMU cannot take a path with a comma"
done
[ -s "$kernel" ] || bad_arg "no guest kernel at $kernel; run vm-images/build.sh first"
[ -s "$initrd" ] || bad_arg "no guest initramfs at $initrd; run vm-images/build.sh first"

need_command qemu-system-x86_64 qemu-system-x86
need_command timeout coreutils

case "$accel" in
auto)
    if "$here/kvm-probe.sh" --kernel "$kernel" --initrd "$initrd" >/dev/null; then accel=kvm; else accel=tcg; fi
    ;;
kvm | tcg) ;;
*) bad_arg "--accel must be auto, kvm or tcg, not '$accel'" ;;
esac
if [ "$accel" = kvm ]; then cpu=host; else cpu=max; fi
accel_opts=$accel
# Under TCG, more than one vCPU runs one host thread per vCPU by default
# (MTTCG). The guest kernel patches its own text while other CPUs run
# (static keys: an int3 byte first, then the new instruction), and MTTCG
# can let another vCPU run a stale translation of the int3 after the
# patch is done: the kernel oopses ("int3" in enqueue_timer, seen in CI).
# One thread for all vCPUs switches between them only at translation-block
# boundaries, after a store's invalidation, so a stale block cannot run.
# The vCPUs still interleave, so multi-queue paths still see traffic on
# every queue.
[ "$accel" != tcg ] || [ "$cpus" -le 1 ] || accel_opts="tcg,thread=single"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -n "$log" ] || log=$tmp/console.log

# Writes one cpio "newc" entry to stdout: NAME, octal MODE, and the file
# whose bytes it holds (none for a directory).
newc_entry() {
    local name=$1 mode=$2 file=${3:-} size=0 namesize
    [ -z "$file" ] || size=$(stat -c %s "$file")
    namesize=$((${#name} + 1))
    printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
        0 $((8#$mode)) 0 0 1 0 "$size" 0 0 0 0 "$namesize" 0
    printf '%s\0' "$name"
    head -c $(((4 - (110 + namesize) % 4) % 4)) /dev/zero
    if [ -n "$file" ]; then
        cat "$file"
        head -c $(((4 - size % 4) % 4)) /dev/zero
    fi
}

# --script: append a second cpio archive holding /sluice/script to a copy of
# the initramfs (the kernel unpacks concatenated archives in order). The
# kernel looks for each archive at a 4-byte boundary, so pad to one first.
if [ -n "$script" ]; then
    cp "$initrd" "$tmp/initrd"
    head -c $(((4 - $(stat -c %s "$initrd") % 4) % 4)) /dev/zero >>"$tmp/initrd"
    {
        newc_entry sluice 040755
        newc_entry sluice/script 0100755 "$script"
        newc_entry TRAILER!!! 0
    } >>"$tmp/initrd"
    initrd=$tmp/initrd
fi

append="console=ttyS0 quiet panic=-1 sluice.mnt=$mnt"
[ -z "$socket" ] || append+=" sluice.tag=$tag"
[ -z "$guest_script" ] || append+=" sluice.script=$guest_script"
[ "$shell" -eq 0 ] || append+=" sluice.shell=1"
[ -z "$extra_append" ] || append+=" $extra_append"

memdev="memory-backend-memfd,id=mem,size=$mem,share=on"
[ -z "$host_node" ] || memdev+=",host-nodes=$host_node,policy=bind"
# shellcheck disable=SC2054 # the commas are QEMU's option syntax
qemu=(qemu-system-x86_64
    -machine q35 -accel "$accel_opts" -cpu "$cpu" -smp "$cpus" -m "$mem"
    # vhost-user backends map guest memory, so it must be shared memory.
    -object "$memdev" -numa node,memdev=mem
    -kernel "$kernel" -initrd "$initrd" -append "$append"
    -nodefaults -no-user-config -display none -serial stdio -no-reboot)
if [ -n "$socket" ]; then
    qemu+=(-chardev "socket,id=char0,path=$socket"
        -device "vhost-user-fs-pci,chardev=char0,tag=$tag,num-request-queues=$queues,queue-size=$queue_size")
fi
n=0
for d in "${disks[@]}"; do
    img=${d#*:}
    # cache=none opens the image with O_DIRECT; a file system without it
    # (tmpfs) gets the host's page cache instead, which a killed QEMU
    # leaves intact just the same.
    cache=none
    if ! dd if="$img" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
        cache=writeback
        say "$img: no O_DIRECT on its file system; cache=writeback"
    fi
    opts="file=$img,format=raw,if=none,id=disk$n,cache=$cache"
    [ "${d%%:*}" = rw ] || opts+=",readonly=on"
    qemu+=(-drive "$opts" -device "virtio-blk-pci,drive=disk$n")
    n=$((n + 1))
done
[ -z "$pidfile" ] || qemu+=(-pidfile "$pidfile")

say "booting ($accel, $cpus vCPUs, $mem${socket:+, virtio-fs $tag on $socket with $queues queue(s) of $queue_size}${disks[*]:+, disks ${disks[*]}})"
start=$(date +%s.%N)
qemu_rc=0
if [ "$shell" -eq 1 ]; then
    timeout --foreground --kill-after=10 "$timeout_s" "${qemu[@]}" 2>&1 | tee "$log" || qemu_rc=${PIPESTATUS[0]}
else
    timeout --kill-after=10 "$timeout_s" "${qemu[@]}" </dev/null 2>&1 | tee "$log" || qemu_rc=${PIPESTATUS[0]}
fi
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

marker=$(tr -d '\r' <"$log" | grep -aoE '^SLUICE-GUEST-EXIT rc=[0-9]+' | tail -n 1 || true)
if [ -n "$marker" ]; then
    rc=${marker#*rc=}
    say "guest exited with status $rc after ${took}s ($accel)"
    exit "$rc"
fi
if [ "$qemu_rc" -eq 137 ] && awk -v t="$took" -v l="$timeout_s" 'BEGIN { exit !(t < l) }'; then
    say "QEMU was killed after ${took}s, before the guest printed its exit marker"
    exit 137
fi
if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
    say "error: the guest printed no exit marker within ${timeout_s}s; killed it"
    exit 124
fi
say "error: QEMU exited with status $qemu_rc after ${took}s before the guest printed its exit marker"
exit 125

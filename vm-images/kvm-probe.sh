#!/usr/bin/env bash
# Tells whether KVM really works here: boots the test guest under KVM with
# sluice.probe=1 and waits for its SLUICE-GUEST-PROBE-OK marker. /dev/kvm
# existing is not enough: nested KVM can hang while booting a guest, so the
# probe has a deadline and counts a hang as "no KVM".
#
# Usage: vm-images/kvm-probe.sh [--kernel PATH] [--initrd PATH]
#                               [--timeout SECS] [--fresh]
#
# Prints "kvm" and exits 0 when KVM works, prints "tcg" and exits 1 when it
# does not. The answer is cached until the host reboots (keyed by the boot
# id); --fresh probes again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vm-images/apt.sh
. "$here/apt.sh"
trap 'say "error: line $LINENO failed: $BASH_COMMAND"' ERR

# The uncompressed kernel boots faster (PVH); build.sh writes both.
kernel=$here/out/vmlinux
[ -s "$kernel" ] || kernel=$here/out/vmlinuz
initrd=$here/out/initramfs.cpio.gz
timeout_s=20
fresh=0
while [ $# -gt 0 ]; do
    case "$1" in
    --kernel) kernel=${2:?--kernel needs a path}; shift 2 ;;
    --initrd) initrd=${2:?--initrd needs a path}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --fresh) fresh=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a whole number of seconds, not '$timeout_s'"

answer() {
    echo "$1"
    [ "$1" = kvm ]
}

if [ ! -c /dev/kvm ] || [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
    say "/dev/kvm is missing or not accessible"
    answer tcg
    exit
fi

boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)
cache_file=${TMPDIR:-/tmp}/sluice-kvm-probe.$boot_id
if [ "$fresh" -eq 0 ] && [ -s "$cache_file" ]; then
    answer "$(cat "$cache_file")"
    exit
fi

if [ ! -s "$kernel" ] || [ ! -s "$initrd" ]; then
    die "no guest image at $kernel / $initrd; run vm-images/build.sh first"
fi
need_command qemu-system-x86_64 qemu-system-x86

log=$(mktemp)
errlog=$(mktemp)
trap 'rm -f "$log" "$errlog"' EXIT
start=$(date +%s.%N)
# The subshell keeps bash's own "Aborted" job report out of our output.
(timeout --kill-after=5 "$timeout_s" qemu-system-x86_64 \
    -machine q35 -accel kvm -cpu host -smp 1 -m 256M \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1 sluice.probe=1" \
    -nodefaults -no-user-config -display none -serial "file:$log" -no-reboot \
    </dev/null >/dev/null || true) 2>"$errlog"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

if grep -aq SLUICE-GUEST-PROBE-OK "$log"; then
    say "KVM works (guest booted in ${took}s)"
    result=kvm
else
    why=$(grep -aE '^qemu-system|KVM' "$errlog" | grep -av 'terminating on signal' | tail -n 1 || true)
    say "KVM does not work here (no probe marker after ${took}s${why:+: $why}); use TCG"
    result=tcg
fi
echo "$result" >"$cache_file"
answer "$result"

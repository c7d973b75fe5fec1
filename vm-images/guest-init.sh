#!/bin/sh
# /init of the sluice test guest (busybox sh). build.sh copies this file into
# the initramfs as /init.
#
# Kernel command line parameters (values must not contain spaces):
#   sluice.tag=TAG        virtio-fs tag to mount; without it nothing is mounted
#   sluice.mnt=DIR        mount point (default /data)
#   sluice.mntopts=OPTS   extra mount options, comma-separated
#   sluice.script=PATH    shell script to run; a relative PATH is taken inside
#                         the mount. Default: /sluice/script when present
#                         (run-vm.sh --script appends it to the initramfs).
#   sluice.shell=1        open a shell on the console before powering off
#   sluice.probe=1        print SLUICE-GUEST-PROBE-OK and power off at once
#   sluice.hold=1         do not power off at the end: print SLUICE-GUEST-HOLD
#                         and wait for the host to stop the VM (a libvirt
#                         test destroys the domain itself)
#
# Markers on the console, each on a line of its own:
#   SLUICE-GUEST-BEGIN ...            init started (uptime in seconds)
#   SLUICE-GUEST-VIRTIOFS ...         the virtio-fs device and its queue count
#   SLUICE-GUEST-ERROR message        init could not do its part
#   SLUICE-GUEST-EXIT rc=N ...        the script's exit status; 253 when the
#                                     mount failed, 254 when the script is missing
#   SLUICE-GUEST-HOLD                 sluice.hold=1: waiting to be stopped
# Then the guest powers off (unless sluice.hold=1).

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root TERM=linux

# The initramfs has no /dev/console node, so init starts without stdio:
# mount devtmpfs first, then take the console.
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname sluice-guest
ip link set lo up 2>/dev/null
# Drivers this kernel has as modules (virtio-blk), put here by build.sh.
for ko in /lib/modules/*.ko; do
    [ -e "$ko" ] || continue
    insmod "$ko" || echo "SLUICE-GUEST-ERROR insmod $ko failed"
done

uptime_s() {
    read -r up _ </proc/uptime
    echo "$up"
}

tag=
mnt=/data
mntopts=
script=
shell=0
probe=0
hold=0
set -f # no globbing of the command line's words
# shellcheck disable=SC2013 # the command line is one line of words
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    sluice.tag=*) tag=${arg#*=} ;;
    sluice.mnt=*) mnt=${arg#*=} ;;
    sluice.mntopts=*) mntopts=${arg#*=} ;;
    sluice.script=*) script=${arg#*=} ;;
    sluice.shell=*) shell=${arg#*=} ;;
    sluice.probe=*) probe=${arg#*=} ;;
    sluice.hold=*) hold=${arg#*=} ;;
    esac
done
set +f

if [ "$probe" = 1 ]; then
    echo "SLUICE-GUEST-PROBE-OK uptime=$(uptime_s)"
    poweroff -f
    sleep 10
fi

echo
echo "SLUICE-GUEST-BEGIN kernel=$(uname -r) cpus=$(grep -c '^processor' /proc/cpuinfo) uptime=$(uptime_s)"

mounted=0

# Prints the exit marker, unmounts, optionally opens a shell, powers off
# (or, with sluice.hold=1, waits to be stopped).
finish() {
    rc=$1
    sync
    if [ "$mounted" = 1 ]; then
        cd /
        umount "$mnt" || echo "SLUICE-GUEST-ERROR umount $mnt failed"
    fi
    # The empty line ends whatever line the script left unfinished.
    echo
    echo "SLUICE-GUEST-EXIT rc=$rc uptime=$(uptime_s)"
    if [ "$shell" = 1 ]; then
        echo "sluice guest shell; exit it to power off"
        setsid cttyhack sh -l
    fi
    if [ "$hold" = 1 ]; then
        echo "SLUICE-GUEST-HOLD"
        while :; do sleep 3600; done
    fi
    poweroff -f
    sleep 10
}

# Prints one line about every virtio-fs device: its virtio name, its tag and
# how many request queues the driver set up, from /sys/fs/virtiofs/N/mqs/*/name
# ("hiprio", "requests.K"), or else from the per-queue interrupt names in
# /proc/interrupts (kernels that list tags but not queues).
report_virtiofs() {
    for fs in /sys/fs/virtiofs/*; do
        [ -e "$fs/tag" ] || continue
        name=$(basename "$(readlink -f "$fs/device")")
        queues=$(cat "$fs"/mqs/*/name 2>/dev/null | grep -c '^requests\.')
        if [ "$queues" -eq 0 ]; then
            queues=$(grep -c " $name-requests\." /proc/interrupts)
        fi
        [ "$queues" -gt 0 ] || queues=unknown
        echo "SLUICE-GUEST-VIRTIOFS device=$name tag=$(cat "$fs/tag") request_queues=$queues"
    done
}

if [ -n "$tag" ]; then
    mkdir -p "$mnt"
    if mount -t virtiofs ${mntopts:+-o "$mntopts"} "$tag" "$mnt"; then
        mounted=1
    else
        echo "SLUICE-GUEST-ERROR mount -t virtiofs $tag $mnt failed"
        report_virtiofs
        finish 253
    fi
fi
report_virtiofs

if [ -z "$script" ] && [ -e /sluice/script ]; then
    script=/sluice/script
fi
if [ -n "$script" ]; then
    case "$script" in
    /*) ;;
    *) script=$mnt/$script ;;
    esac
    if [ ! -f "$script" ]; then
        echo "SLUICE-GUEST-ERROR script $script not found"
        finish 254
    fi
    echo "SLUICE-GUEST-SCRIPT $script"
    if [ "$mounted" = 1 ]; then cd "$mnt" || finish 253; else cd /; fi
    SLUICE_TAG=$tag SLUICE_MNT=$mnt sh "$script"
    rc=$?
    cd /
    finish "$rc"
fi
finish 0

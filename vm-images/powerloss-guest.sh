#!/bin/sh
# The guest side of the power-loss test (tests/e2e_powerloss.rs), run by
# /init through run-vm.sh --script. Busybox sh.
#
# Disks: /dev/vda (read-only) holds the programs: bin/sluice,
# bin/e2e_powerloss (the test binary, whose ignored test `guest_side` is the
# writer and the checker), optionally bin/juicefs, and lib/ with the shared
# libraries they need. /dev/vdb holds the SQLite database (meta.db) and
# /dev/vdc the bucket: two disks, so that syncing one says nothing about
# the other.
#
# Kernel command line: pl.round=N (0 formats the volume), pl.final=1 (check,
# then fsck and gc instead of writing), pl.seed=S.
#
# Each round mounts the volume with `sluice mount`, checks every file (the
# previous round was cut off by the host killing QEMU), then either writes
# until the host kills QEMU again or, in the final round, unmounts and runs
# `juicefs fsck` and `sluice gc`, mounts again and checks once more.
#
# Console lines for the host: PL-STEP name, PL-FILE ..., PL-CHECKED n
# (from plguest), PL-FSYNCED ... (from the writer), PL-FSCK rc=N,
# PL-GC ..., PL-DONE; PL-ERROR message ends the round with status 1.

round=0
final=0
seed=1
# shellcheck disable=SC2013 # the command line is one line of words
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    pl.round=*) round=${arg#*=} ;;
    pl.final=*) final=${arg#*=} ;;
    pl.seed=*) seed=${arg#*=} ;;
    esac
done

fail() {
    echo "PL-ERROR $*"
    [ -f /tmp/sluice.log ] && tail -n 30 /tmp/sluice.log
    exit 1
}
step() {
    echo "PL-STEP $* uptime=$(cut -d' ' -f1 /proc/uptime)"
}

mkdir -p /tools /meta /data /mnt/vol /lib64 /var/cache/sluice
mount -t ext4 -o ro /dev/vda /tools || fail "cannot mount the tools disk /dev/vda"
# After a kill these replay the ext4 journals: what the guest had flushed.
mount -t ext4 /dev/vdb /meta || fail "cannot mount the metadata disk /dev/vdb"
mount -t ext4 /dev/vdc /data || fail "cannot mount the bucket disk /dev/vdc"
ln -sf /tools/lib/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
export LD_LIBRARY_PATH=/tools/lib
export PATH="/tools/bin:$PATH"
meta=sqlite3:///meta/meta.db

# The test binary's ignored test `guest_side`: plguest check DIR, or
# plguest write DIR ROUND SEED.
plguest() {
    PL_ROLE=$1 PL_DIR=$2 PL_ROUND=${3:-0} PL_SEED=${4:-0} \
        e2e_powerloss guest_side --exact --ignored --nocapture --test-threads=1
}

sluice_mount() {
    rm -f /tmp/sluice.log
    sluice mount "$meta" /mnt/vol --background --log /tmp/sluice.log \
        --cache-size 64 --buffer-size 16 || fail "sluice mount failed"
    grep -q ' /mnt/vol fuse' /proc/mounts || fail "no mount on /mnt/vol"
}

# Unmounts and waits for the mount's process to exit (it commits and closes
# the database on its way out).
sluice_umount() {
    sluice umount /mnt/vol || fail "sluice umount failed"
    n=0
    while pidof sluice >/dev/null; do
        n=$((n + 1))
        [ "$n" -lt 600 ] || fail "the mount process did not exit"
        sleep 0.1
    done
}

if [ "$round" = 0 ]; then
    step format
    sluice format "$meta" pl --bucket /data/bucket --trash-days 0 ||
        fail "sluice format failed"
fi
step mount
sluice_mount
step check
plguest check /mnt/vol || fail "the check could not run"

if [ "$final" != 1 ]; then
    step write
    # Runs until the host kills QEMU.
    plguest write /mnt/vol "$round" "$seed"
    fail "the writer stopped: $?"
fi

step umount
sluice_umount
if [ -x /tools/bin/juicefs ]; then
    step fsck
    HOME=/tmp juicefs fsck "$meta" 2>&1
    echo "PL-FSCK rc=$?"
fi
step gc
sluice gc "$meta" --delete --min-age 0 2>&1 | sed 's/^/PL-GC /'
step remount
sluice_mount
step recheck
plguest check /mnt/vol || fail "the check could not run"
sluice_umount
echo "PL-DONE"

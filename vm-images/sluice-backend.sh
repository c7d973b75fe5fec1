#!/usr/bin/env bash
# Runs `sluice serve` as the backend of smoke-virtiofsd.sh (its --backend-cmd),
# so the same guest checks run against sluice instead of virtiofsd.
#
# In: SOCKET (the vhost-user socket), SHARED_DIR (a directory the host has
# filled). The script formats a SQLite + local-directory volume, copies
# SHARED_DIR's files into it through a sluice FUSE mount, then mounts the
# volume on SHARED_DIR itself (so the host's checks read the volume), and
# serves the same volume to the guest. Unmounts on exit.
# Usage: SOCKET=... SHARED_DIR=... vm-images/sluice-backend.sh SLUICE_BINARY [serve options...]
set -euo pipefail
sluice=${1:?usage: sluice-backend.sh SLUICE_BINARY [serve options...]}
shift
: "${SOCKET:?SOCKET must name the vhost-user socket}" "${SHARED_DIR:?SHARED_DIR must name the shared directory}"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/sluice-backend.XXXXXX")
meta="sqlite3://$work/meta.db"
serve_pid=
cleanup() {
    [ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true
    for m in "$work/stage" "$SHARED_DIR"; do
        if grep -qs " $m fuse.sluice " /proc/mounts; then "$sluice" umount --lazy "$m" || true; fi
    done
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$sluice" format "$meta" smoke --bucket "$work/objects" --trash-days 0
mkdir -p "$work/stage"
"$sluice" mount --background --log "$work/stage.log" "$meta" "$work/stage"
cp -a "$SHARED_DIR/." "$work/stage/"
"$sluice" umount "$work/stage"
# The host's view of the volume, where the smoke test looks for the guest's changes.
"$sluice" mount --background --log "$work/host-mount.log" --attr-cache 0 --entry-cache 0 "$meta" "$SHARED_DIR"
"$sluice" serve "$meta" --socket "$SOCKET" --tag "${TAG:-sluice}" "$@" &
serve_pid=$!
wait "$serve_pid"

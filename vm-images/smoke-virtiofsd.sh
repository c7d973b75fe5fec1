#!/usr/bin/env bash
# End-to-end check of the guest tooling against a real vhost-user-fs backend:
# builds the guest, serves a temporary directory with virtiofsd, boots the
# guest with run-vm.sh, and has the guest read, write, rename, delete and
# list files in the share; then checks every change from the host side.
#
# Usage: vm-images/smoke-virtiofsd.sh [--queues N] [--backend-cmd CMD]
#                                     [--timeout SECS] [--keep]
#
#   --queues N        request queues to give the guest (default 1: virtiofsd
#                     takes only one)
#   --backend-cmd CMD run CMD as the backend instead of virtiofsd; it is run
#                     by bash with SOCKET (the vhost-user socket to listen on)
#                     and SHARED_DIR (the directory to serve) in its
#                     environment, e.g. 'sluice serve --socket "$SOCKET" ...'
#   --timeout SECS    guest timeout (default 300)
#   --keep            keep the work directory (share, logs) for a look
#
# Exits 0 when every check passed, 1 when one failed. When no virtiofsd can
# be found or installed (and no --backend-cmd is given) it prints SKIP and
# exits 0.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vm-images/apt.sh
. "$here/apt.sh"
trap 'say "error: line $LINENO failed: $BASH_COMMAND"' ERR

queues=1
backend_cmd=
timeout_s=300
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
    --queues) queues=${2:?--queues needs a number}; shift 2 ;;
    --backend-cmd) backend_cmd=${2:?--backend-cmd needs a command}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$queues" =~ ^[1-9][0-9]*$ ]] || die "--queues must be a positive number, not '$queues'"

# Prints the path of a virtiofsd binary, or nothing.
find_virtiofsd() {
    local c
    for c in "${VIRTIOFSD:-}" "$(cd "$here/.." && pwd)/.tools/bin/virtiofsd" /usr/libexec/virtiofsd \
        /usr/lib/qemu/virtiofsd "$(command -v virtiofsd || true)"; do
        if [ -n "$c" ] && [ -x "$c" ]; then
            printf '%s\n' "$c"
            return 0
        fi
    done
}

"$here/build.sh"
need_command qemu-system-x86_64 qemu-system-x86

if [ -z "$backend_cmd" ]; then
    vfsd=$(find_virtiofsd)
    # Debian 12 ships QEMU's C virtiofsd with QEMU; later releases package the
    # Rust one as "virtiofsd".
    if [ -z "$vfsd" ] && apt-cache show virtiofsd >/dev/null 2>&1; then
        need_command /usr/libexec/virtiofsd virtiofsd
        vfsd=$(find_virtiofsd)
    fi
    if [ -z "$vfsd" ]; then
        say "SKIP: no virtiofsd found or installable (set VIRTIOFSD=PATH, or"
        say "      cargo install virtiofsd --root $(cd "$here/.." && pwd)/.tools)"
        exit 0
    fi
    if "$vfsd" --help 2>&1 | grep -q -- '--shared-dir'; then
        # The Rust virtiofsd.
        backend_cmd="$vfsd --socket-path \"\$SOCKET\" --shared-dir \"\$SHARED_DIR\" --cache auto --sandbox chroot"
    else
        # QEMU's C virtiofsd.
        backend_cmd="$vfsd --socket-path=\"\$SOCKET\" -o source=\"\$SHARED_DIR\" -o cache=auto -o sandbox=chroot"
    fi
    say "backend: $("$vfsd" --version 2>&1 | head -n 1) ($vfsd)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-smoke.XXXXXX")
share=$work/share
socket=$work/vhost-fs.sock
backend_pid=
cleanup() {
    if [ -n "$backend_pid" ] && kill -0 "$backend_pid" 2>/dev/null; then
        kill "$backend_pid" 2>/dev/null || true
        wait "$backend_pid" 2>/dev/null || true
    fi
    if [ "$keep" -eq 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# What the host puts in the share before the guest starts.
mkdir -p "$share/dir"
head -c 4194304 /dev/urandom >"$share/input.bin"
for n in a b c; do echo "file $n" >"$share/dir/$n.txt"; done
echo "rename me" >"$share/to-rename.txt"
echo "delete me" >"$share/to-delete.txt"
host_input_sha=$(sha256sum "$share/input.bin" | cut -d' ' -f1)
# shellcheck disable=SC2012 # the names are ours; ls sorts them like the guest's ls
host_listing=$(cd "$share/dir" && ls | tr '\n' ' ')

# What the guest does; it reports through SMOKE lines on the console.
cat >"$work/guest.sh" <<'GUEST'
set -e
echo "SMOKE input $(sha256sum input.bin | cut -d' ' -f1)"
echo "SMOKE listing $(ls dir | tr '\n' ' ')"
# An odd size, so the last read and write are partial pages.
head -c 3000001 /dev/urandom >from-guest.bin
echo "SMOKE wrote $(sha256sum from-guest.bin | cut -d' ' -f1)"
mkdir guest-dir
echo "written in the guest" >guest-dir/note.txt
mv to-rename.txt renamed.txt
rm to-delete.txt
echo "appended in the guest" >>dir/a.txt
sync
echo "SMOKE done"
GUEST

SOCKET=$socket SHARED_DIR=$share bash -c "exec $backend_cmd" >"$work/backend.log" 2>&1 &
backend_pid=$!
for _ in $(seq 100); do
    [ -S "$socket" ] && break
    kill -0 "$backend_pid" 2>/dev/null || break
    sleep 0.1
done
if [ ! -S "$socket" ]; then
    cat "$work/backend.log" >&2
    die "the backend did not create $socket (its log is above)"
fi

rc=0
"$here/run-vm.sh" --socket "$socket" --queues "$queues" --script "$work/guest.sh" \
    --timeout "$timeout_s" --log "$work/console.log" || rc=$?
console=$(tr -d '\r' <"$work/console.log")

failures=0
# Usage: check WHAT COMMAND... ; counts a failure when COMMAND fails.
check() {
    local what=$1
    shift
    if "$@"; then
        say "PASS $what"
    else
        say "FAIL $what"
        failures=$((failures + 1))
    fi
}
# Prints the value of the guest's last "SMOKE NAME value" line.
smoke_value() {
    printf '%s\n' "$console" | sed -n "s/^SMOKE $1 //p" | tail -n 1
}
# Prints a file's sha256, or "missing".
file_sha() {
    if [ -f "$1" ]; then sha256sum <"$1" | cut -d' ' -f1; else echo missing; fi
}
# Prints "present" or "absent".
presence() {
    if [ -e "$1" ]; then echo present; else echo absent; fi
}
guest_queues=$(printf '%s\n' "$console" |
    sed -n 's/.*SLUICE-GUEST-VIRTIOFS .*request_queues=\([0-9a-z]*\).*/\1/p' | tail -n 1)
guest_sha=$(smoke_value wrote)

check "guest script exited 0 (got $rc)" [ "$rc" -eq 0 ]
check "guest saw $queues request queue(s) (got ${guest_queues:-none})" [ "$guest_queues" = "$queues" ]
check "guest read the host's file intact (sha256)" [ "$(smoke_value input)" = "$host_input_sha" ]
check "guest listed the host's directory" [ "$(smoke_value listing)" = "$host_listing" ]
check "host reads the guest's file intact (sha256)" [ "$(file_sha "$share/from-guest.bin")" = "${guest_sha:-none}" ]
check "host sees the guest's 3000001-byte size" [ "$(stat -c %s "$share/from-guest.bin" 2>/dev/null)" = 3000001 ]
check "host sees the guest's new directory and file" \
    [ "$(cat "$share/guest-dir/note.txt" 2>/dev/null)" = "written in the guest" ]
check "host sees the guest's rename" \
    [ "$(presence "$share/renamed.txt") $(presence "$share/to-rename.txt")" = "present absent" ]
check "host sees the guest's delete" [ "$(presence "$share/to-delete.txt")" = absent ]
check "host sees the guest's append" [ "$(tail -n 1 "$share/dir/a.txt")" = "appended in the guest" ]

if [ "$failures" -ne 0 ]; then
    say "backend log (last lines):"
    tail -n 20 "$work/backend.log" >&2
    die "$failures check(s) failed"
fi
say "all checks passed"

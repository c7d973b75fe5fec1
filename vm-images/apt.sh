# shellcheck shell=bash
# Package helpers shared by the vm-images scripts (sourced, not run).
#
# The scripts must work on a fresh Debian machine (CI runs a clean clone as
# root), so they install what they miss. Other processes may hold the apt
# lock for a while; every apt call waits for it instead of failing.

# Prints a message on stderr, prefixed with the calling script's name.
say() {
    printf '%s: %s\n' "${0##*/}" "$*" >&2
}

# Prints an error on stderr and exits with status 1.
die() {
    say "error: $*"
    exit 1
}

# Runs an apt command, retrying for up to ten minutes while another process
# holds the apt or dpkg lock. Output goes to stderr; the exit status is apt's.
apt_retry() {
    local tries=0 out rc
    while :; do
        out=$(DEBIAN_FRONTEND=noninteractive "$@" -o DPkg::Lock::Timeout=60 2>&1) && rc=0 || rc=$?
        if [ "$rc" -eq 0 ]; then
            printf '%s\n' "$out" | tail -n 2 >&2
            return 0
        fi
        if printf '%s' "$out" | grep -qE 'Could not get lock|Unable to lock|is held by process' &&
            [ "$tries" -lt 60 ]; then
            tries=$((tries + 1))
            say "apt is locked by another process; waiting (try $tries/60)"
            sleep 10
            continue
        fi
        printf '%s\n' "$out" >&2
        return "$rc"
    done
}

APT_UPDATED=0

# Runs `apt-get update` once per script run.
apt_update_once() {
    [ "$APT_UPDATED" -eq 1 ] && return 0
    command -v apt-get >/dev/null || die "apt-get not found: these scripts need a Debian or Ubuntu host"
    [ "$(id -u)" -eq 0 ] || die "installing packages needs root; run as root or install them yourself"
    say "apt-get update"
    apt_retry apt-get update || die "apt-get update failed (see above)"
    APT_UPDATED=1
}

# Makes sure COMMAND exists, installing Debian PACKAGE when it does not.
# Usage: need_command COMMAND PACKAGE
need_command() {
    local cmd=$1 pkg=$2
    command -v "$cmd" >/dev/null && return 0
    apt_update_once
    say "installing $pkg (for $cmd)"
    apt_retry apt-get install -y --no-install-recommends "$pkg" ||
        die "could not install $pkg; install it by hand and rerun"
    command -v "$cmd" >/dev/null || die "$pkg is installed but $cmd is still missing"
}

# Downloads the .deb of PACKAGE into DIR unless one is already there, and
# prints its path. Runs `apt-get update` first only when apt does not know
# the package yet.
# Usage: apt_download_cached PACKAGE DIR
apt_download_cached() {
    local pkg=$1 dir=$2 deb
    mkdir -p "$dir"
    deb=$(find "$dir" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n 1)
    if [ -n "$deb" ]; then
        printf '%s\n' "$deb"
        return 0
    fi
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
        apt_update_once
    fi
    say "downloading $pkg"
    # apt-get download writes into the current directory.
    (cd "$dir" && apt_retry apt-get download -o APT::Sandbox::User=root "$pkg") || die "could not download $pkg"
    deb=$(find "$dir" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n 1)
    [ -n "$deb" ] || die "apt-get download $pkg left no .deb in $dir"
    printf '%s\n' "$deb"
}

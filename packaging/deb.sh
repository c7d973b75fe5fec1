#!/usr/bin/env bash
# Builds sluice's Debian package with cargo-deb (`[package.metadata.deb]` in
# Cargo.toml: the binary, the systemd units, shell completions, the Grafana
# dashboard, the vhost-user descriptor for libvirt, the docs), then checks
# it: the architecture, the files, the descriptor, and that the packaged
# binary runs (under qemu-aarch64 for arm64).
#
#   packaging/deb.sh                                   # x86_64 (this host), release
#   packaging/deb.sh --target aarch64-unknown-linux-gnu  # arm64, after .ci/aarch64.sh build-release
#   packaging/deb.sh --profile dev --no-build           # what CI does: package the test build
#
# The .deb lands in $CARGO_TARGET_DIR/[TARGET/]debian/. For arm64 the
# binary comes from .ci/aarch64.sh's target dir (target/aarch64-cross, or
# $SLUICE_AARCH64_TARGET_DIR); build it first with
# SLUICE_AARCH64_PROFILE=PROFILE .ci/aarch64.sh build-release.
set -euo pipefail
cd "$(dirname "$0")/.."
target=
profile=release
build=1
while [ $# -gt 0 ]; do
    case "$1" in
    --target) target=${2:?}; shift 2 ;;
    --profile) profile=${2:?}; shift 2 ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "packaging/deb.sh: $*" >&2; exit 1; }

if ! command -v cargo-deb >/dev/null; then
    cargo install --locked --quiet cargo-deb --version 3.8.0
fi
command -v dpkg-deb >/dev/null || die "needs dpkg-deb"

host_dir=${CARGO_TARGET_DIR:-target}
dir_of() { if [ "$1" = dev ]; then echo debug; else echo "$1"; fi; }

# Completions are the same on every architecture: made with a host build.
host_bin=$host_dir/$(dir_of "$profile")/sluice
if [ -n "$target" ] || [ ! -x "$host_bin" ]; then
    host_bin=$host_dir/debug/sluice
    [ -x "$host_bin" ] || cargo build --quiet --bin sluice
fi
mkdir -p target/deb-assets
"$host_bin" completions bash >target/deb-assets/sluice.bash
"$host_bin" completions zsh >target/deb-assets/_sluice
"$host_bin" completions fish >target/deb-assets/sluice.fish

args=(--profile "$profile")
[ "$build" = 1 ] || args+=(--no-build)
arch=amd64
run=()
if [ -n "$target" ]; then
    [ "$target" = aarch64-unknown-linux-gnu ] || die "--target: only aarch64-unknown-linux-gnu is set up"
    export CARGO_TARGET_DIR=${SLUICE_AARCH64_TARGET_DIR:-target/aarch64-cross}
    args+=(--target "$target")
    arch=arm64
    # The cross binary is stripped with the cross binutils, or not at all.
    if command -v aarch64-linux-gnu-strip >/dev/null; then
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_STRIP=aarch64-linux-gnu-strip
    else
        args+=(--no-strip)
    fi
    run=(qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
    [ "$build" = 0 ] || die "build the arm64 binary with .ci/aarch64.sh build-release, then pass --no-build"
fi
deb=$(cargo deb "${args[@]}" | tail -1)
[ -f "$deb" ] || die "cargo deb made no package (it said: $deb)"
echo "built $deb"

# The checks.
info=$(dpkg-deb --field "$deb" Package Architecture Version)
echo "$info"
grep -qx "Architecture: $arch" <<<"$info" || die "$deb is not for $arch"
files=$(dpkg-deb --contents "$deb" | awk '{print $NF}')
for f in ./usr/bin/sluice \
    ./usr/lib/systemd/system/sluice-mount@.service \
    ./usr/lib/systemd/system/sluice-serve@.service \
    ./usr/lib/systemd/system/sluice-host@.service \
    ./usr/share/bash-completion/completions/sluice \
    ./usr/share/zsh/vendor-completions/_sluice \
    ./usr/share/fish/vendor_completions.d/sluice.fish \
    ./usr/share/sluice/grafana/sluice.json \
    ./usr/share/qemu/vhost-user/90-sluice.json \
    ./usr/share/doc/sluice/deployment.md \
    ./usr/share/doc/sluice/examples/example.env; do
    grep -qxF "$f" <<<"$files" || die "$deb lacks $f"
done
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
dpkg-deb --extract "$deb" "$tree"
if [ "$arch" = arm64 ] && ! command -v qemu-aarch64 >/dev/null; then
    echo "SKIPPED: running the arm64 binary (no qemu-aarch64)" >&2
else
    "${run[@]}" "$tree/usr/bin/sluice" --version
fi
grep -q 'ExecStart=/usr/bin/sluice' "$tree/usr/lib/systemd/system/sluice-serve@.service" ||
    die "the serve unit does not run /usr/bin/sluice"
# libvirt reads the vhost-user descriptor as JSON and runs its "binary".
python3 - "$tree/usr/share/qemu/vhost-user/90-sluice.json" <<'PY' ||
import json, sys
d = json.load(open(sys.argv[1]))
assert d["type"] == "fs" and d["binary"] == "/usr/bin/sluice", d
PY
    die "the vhost-user descriptor is not an fs backend naming /usr/bin/sluice"
echo "ok: $deb"

#!/usr/bin/env bash
# arm64 (aarch64) cross-build and qemu-user test driver. See DEVELOPERS.md.
#
#   .ci/aarch64.sh setup          install the cross toolchain (idempotent)
#   .ci/aarch64.sh test-simd      cross-build sluice-simd's tests, run them under
#                                 qemu-aarch64 three ways (-cpu max, -cpu cortex-a72,
#                                 SLUICE_SIMD=scalar), printing the kernels each used
#   .ci/aarch64.sh test-numa      cross-build sluice-numa's tests and run them under
#                                 qemu-aarch64 (no io_uring there: the thread-pool
#                                 fallback is the path under test)
#   .ci/aarch64.sh build-release  cross-build the `sluice` binary (release profile;
#                                 SLUICE_AARCH64_PROFILE=dev for a debug build)
#
# The Rust toolchain for aarch64 is Debian's `rustc-web` with its arm64 standard
# library (`libstd-rust-web-dev:arm64`): rustup may not be able to download
# targets on CI, Debian's mirror always can. Cargo stays the host's cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu
DEB_RUSTC=/usr/bin/rustc
# qemu-user runs the cross-built binaries. `-L` makes the cross sysroot the
# guest's root for the ELF interpreter; LD_LIBRARY_PATH makes that loader
# take libc from the same sysroot. Without it the loader finds the
# multiarch libc6:arm64 (a different glibc build, pulled in by
# libstd-rust-web-dev:arm64) through the host's ld.so.cache, and the
# mismatched pair hangs in the first pthread_create.
QEMU=(qemu-aarch64 -L "$SYSROOT" -E "LD_LIBRARY_PATH=$SYSROOT/lib")

# Separate target dir: the Debian rustc must not share artifacts with rustup's.
export CARGO_TARGET_DIR="${SLUICE_AARCH64_TARGET_DIR:-target/aarch64-cross}"

cross_env() {
    export RUSTC="$DEB_RUSTC"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    # cc-rs based -sys crates (rusqlite bundled, zstd, lz4) compile C for arm64.
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    export PKG_CONFIG_ALLOW_CROSS=1
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="${QEMU[*]} -cpu max"
}

setup() {
    local need=()
    command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
    command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
    [[ -e $SYSROOT/lib/libc.so.6 ]] || need+=(libc6-dev-arm64-cross)
    command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
    [[ -x $DEB_RUSTC ]] || need+=(rustc-web)
    if ! ls /usr/lib/rustlib/$TARGET/lib/libstd-*.rlib >/dev/null 2>&1; then
        need+=(libstd-rust-web-dev:arm64)
    fi
    if ((${#need[@]} == 0)); then
        echo "aarch64 toolchain already installed"
    else
        if ! dpkg --print-foreign-architectures | grep -qx arm64; then
            dpkg --add-architecture arm64
        fi
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # Both rustc-web packages must come from the same Debian version.
        apt-get install -y -qq "${need[@]}" rustc-web libstd-rust-web-dev:arm64
    fi
    "$DEB_RUSTC" --version
    qemu-aarch64 --version | head -1
}

# Runs one qemu configuration of the already-built test binary.
run_tests() {
    local label=$1 cpu=$2 simd=$3 bin=$4
    echo "=== sluice-simd tests under qemu-aarch64 -cpu $cpu${simd:+, SLUICE_SIMD=$simd} ($label)"
    env ${simd:+SLUICE_SIMD=$simd} \
        "${QEMU[@]}" -cpu "$cpu" "$bin" --exact dispatch::tests::print_selected --nocapture 2>&1 |
        grep -E '^sluice-simd selected' || {
        echo "could not read the selected kernels" >&2
        return 1
    }
    env ${simd:+SLUICE_SIMD=$simd} "${QEMU[@]}" -cpu "$cpu" "$bin" -q
}

test_simd() {
    cross_env
    # Optimized: the exhaustive length × misalignment tests take minutes
    # per configuration under emulation in a debug build.
    cargo test -p sluice-simd --target "$TARGET" --lib --release --no-run
    local bin
    bin=$(cargo test -p sluice-simd --target "$TARGET" --lib --release --no-run \
        --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    if [[ -z $bin ]]; then
        echo "no test binary was built" >&2
        return 1
    fi
    # Fail on the first configuration that fails, but report all three.
    local rc=0
    run_tests "SVE, SHA3, PMULL, CRC" max "" "$bin" || rc=1
    run_tests "NEON, CRC, PMULL; no SVE, no SHA3" cortex-a72 "" "$bin" || rc=1
    run_tests "scalar reference forced" max scalar "$bin" || rc=1
    return $rc
}

test_numa() {
    cross_env
    local bins
    bins=$(cargo test -p sluice-numa --target "$TARGET" --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
    if [[ -z $bins ]]; then
        cargo test -p sluice-numa --target "$TARGET" --no-run
        echo "no test binary was built" >&2
        return 1
    fi
    local bin
    for bin in $bins; do
        echo "=== $(basename "$bin") under qemu-aarch64 -cpu max"
        # Integration tests read their fixtures relative to the crate.
        (cd numa && "${QEMU[@]}" -cpu max "$bin" -q)
    done
}

build_release() {
    cross_env
    local profile=${SLUICE_AARCH64_PROFILE:-release}
    cargo build --bin sluice --target "$TARGET" --profile "$profile"
    local dir=$profile
    [[ $profile == dev ]] && dir=debug
    local out=$CARGO_TARGET_DIR/$TARGET/$dir/sluice
    file "$out" 2>/dev/null || ls -l "$out"
    # The binary must start on arm64.
    "${QEMU[@]}" -cpu max "$out" --help >/dev/null
}

case "${1:-}" in
    setup) setup ;;
    test-simd) test_simd ;;
    test-numa) test_numa ;;
    build-release) build_release ;;
    *)
        echo "usage: $0 setup|test-simd|test-numa|build-release" >&2
        exit 2
        ;;
esac

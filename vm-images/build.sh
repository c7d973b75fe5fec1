#!/usr/bin/env bash
# Builds the sluice test guest: a Debian cloud kernel (Linux >= 6.10, for
# multi-queue virtio-fs; virtio-pci, fuse and virtiofs are built in) and an
# initramfs holding busybox, guest-init.sh as /init, the kernel's virtio-blk
# module (loaded by /init, so disks given to run-vm.sh --disk appear as
# /dev/vdX) and any extra static programs given with --bin.
#
# Usage: vm-images/build.sh [--out DIR] [--cache DIR] [--bin PATH]...
#                           [--kernel-pkg NAME] [--refresh]
#
#   --out DIR         where vmlinuz (bzImage), vmlinux (the same kernel
#                     uncompressed, for faster PVH boot), initramfs.cpio.gz
#                     and manifest.txt go (default vm-images/out)
#   --cache DIR       downloaded packages (default vm-images/out/cache)
#   --bin PATH        a statically linked program to put in the guest's /bin
#                     (repeatable)
#   --kernel-pkg NAME a Debian kernel package instead of the newest
#                     linux-image-*-cloud-amd64-unsigned
#   --refresh         look for a newer kernel package even if one is cached
#
# Downloads happen once (cached); a rerun with the same inputs does nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vm-images/apt.sh
. "$here/apt.sh"
trap 'say "error: line $LINENO failed: $BASH_COMMAND"' ERR

out=$here/out
cache=
bins=()
kernel_pkg=
refresh=0
remember_kernel=0

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
    --bin) bins+=("${2:?--bin needs a path}"); shift 2 ;;
    --kernel-pkg) kernel_pkg=${2:?--kernel-pkg needs a package name}; shift 2 ;;
    --refresh) refresh=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
    esac
done
[ -n "$cache" ] || cache=$here/out/cache
mkdir -p "$out" "$cache"
out=$(cd "$out" && pwd)
cache=$(cd "$cache" && pwd)

[ "$(uname -m)" = x86_64 ] || die "the guest image is x86_64; this host is $(uname -m)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found: build.sh needs a Debian or Ubuntu host"

for b in "${bins[@]}"; do
    if [ ! -f "$b" ] || [ ! -x "$b" ]; then die "--bin $b is not an executable file"; fi
    case "${b##*/}" in busybox | init) die "--bin $b: the guest already has a /bin/${b##*/}; rename it" ;; esac
    # A dynamically linked program cannot run in the initramfs (no libc there).
    if command -v ldd >/dev/null &&
        ! { ldd "$b" 2>&1 || true; } | grep -qE 'not a dynamic executable|statically linked'; then
        die "--bin $b is dynamically linked; build it statically (e.g. --target x86_64-unknown-linux-musl)"
    fi
done

# Prints the newest linux-image-X.Y.Z...-cloud-amd64-unsigned package apt knows.
newest_cloud_kernel() {
    apt-cache search --names-only '^linux-image-[0-9][0-9.+a-z-]*-cloud-amd64-unsigned$' 2>/dev/null |
        awk '{print $1}' | sort -V | tail -n 1
}

# Kernel: resolve the package name once and remember it, so reruns need no apt.
kernel_name_file=$cache/kernel-package
if [ -z "$kernel_pkg" ]; then
    if [ "$refresh" -eq 0 ] && [ -s "$kernel_name_file" ]; then
        kernel_pkg=$(cat "$kernel_name_file")
    else
        [ "$refresh" -eq 1 ] && apt_update_once
        kernel_pkg=$(newest_cloud_kernel)
        if [ -z "$kernel_pkg" ]; then
            apt_update_once
            kernel_pkg=$(newest_cloud_kernel)
        fi
        [ -n "$kernel_pkg" ] || die "apt knows no linux-image-*-cloud-amd64-unsigned package; pass --kernel-pkg NAME"
        # Remembered only once its image is extracted below.
        remember_kernel=1
    fi
fi
kver=${kernel_pkg#linux-image-}
kver=${kver%-unsigned}
kdir=$cache/kernel-$kver
if [ ! -s "$kdir/vmlinuz" ]; then
    deb=$(apt_download_cached "$kernel_pkg" "$cache/debs")
    say "extracting the kernel from ${deb##*/}"
    rm -rf "$kdir.tmp"
    mkdir -p "$kdir.tmp"
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$kdir.tmp" --wildcards './boot/vmlinuz-*' './boot/config-*'
    mv "$kdir.tmp"/boot/vmlinuz-* "$kdir.tmp/vmlinuz"
    mv "$kdir.tmp"/boot/config-* "$kdir.tmp/config"
    rmdir "$kdir.tmp/boot"
    rm -rf "$kdir"
    mv "$kdir.tmp" "$kdir"
fi

[ "$remember_kernel" -eq 0 ] || printf '%s\n' "$kernel_pkg" >"$kernel_name_file"

# Kernel drivers the guest needs that this kernel builds as modules, taken
# out of the package (decompressed: busybox's insmod takes plain .ko files).
# Paths under lib/modules/VERSION/kernel/, without the .ko suffix.
modules=(drivers/block/virtio_blk)
mkdir -p "$kdir/modules"
for m in "${modules[@]}"; do
    name=${m##*/}
    config=CONFIG_$(printf '%s' "$name" | tr '[:lower:]' '[:upper:]')
    grep -q "^$config=y" "$kdir/config" && continue
    grep -q "^$config=m" "$kdir/config" || die "$kernel_pkg has no $config; pick another kernel with --kernel-pkg"
    [ -s "$kdir/modules/$name.ko" ] && continue
    deb=$(apt_download_cached "$kernel_pkg" "$cache/debs")
    say "extracting module $name from ${deb##*/}"
    rm -rf "$kdir/modules.tmp"
    mkdir -p "$kdir/modules.tmp"
    dpkg-deb --fsys-tarfile "$deb" |
        tar -x -C "$kdir/modules.tmp" --wildcards "./lib/modules/*/kernel/$m.ko*"
    ko=$(find "$kdir/modules.tmp" -name "$name.ko*" | head -n 1)
    [ -n "$ko" ] || die "${deb##*/} has no $m.ko"
    case "$ko" in
    *.ko) cp "$ko" "$kdir/modules/$name.ko.tmp" ;;
    *.ko.xz) need_command xz xz-utils; xz -dc "$ko" >"$kdir/modules/$name.ko.tmp" ;;
    *.ko.zst) need_command zstd zstd; zstd -qdc "$ko" >"$kdir/modules/$name.ko.tmp" ;;
    *.ko.gz) gzip -dc "$ko" >"$kdir/modules/$name.ko.tmp" ;;
    *) die "cannot unpack $ko" ;;
    esac
    mv "$kdir/modules/$name.ko.tmp" "$kdir/modules/$name.ko"
    rm -rf "$kdir/modules.tmp"
done

# Refuse a kernel the virtio-fs tests cannot use, with the reason.
major_minor=$(printf '%s\n' "$kver" | grep -oE '^[0-9]+\.[0-9]+')
if [ "$(printf '%s\n6.10\n' "$major_minor" | sort -V | head -n 1)" != 6.10 ]; then
    die "$kernel_pkg is Linux $major_minor; multi-queue virtio-fs needs >= 6.10 (pass --kernel-pkg)"
fi
for opt in VIRTIO_PCI FUSE_FS VIRTIO_FS SERIAL_8250_CONSOLE DEVTMPFS BLK_DEV_INITRD RD_GZIP; do
    grep -q "^CONFIG_$opt=y" "$kdir/config" ||
        die "$kernel_pkg does not build in CONFIG_$opt; pick another kernel with --kernel-pkg"
done

# The uncompressed kernel, for PVH boot: QEMU then jumps straight into the
# 64-bit kernel, skipping the firmware's real-mode setup and the kernel's
# self-decompression, which under TCG take about a third of the boot.
# The compressed payload sits at (setup_sects + 1) * 512 + payload_offset
# in the bzImage and is followed by 4 bytes holding the uncompressed size.
extract_vmlinux() {
    local bz=$1 dest=$2 setup_sects payload_offset payload_length start magic size
    setup_sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$bz" | tr -d ' ')
    payload_offset=$(od -An -tu4 -j $((0x248)) -N4 "$bz" | tr -d ' ')
    payload_length=$(od -An -tu4 -j $((0x24c)) -N4 "$bz" | tr -d ' ')
    start=$(((setup_sects + 1) * 512 + payload_offset))
    magic=$(od -An -tx1 -j "$start" -N4 "$bz" | tr -d ' ')
    case "$magic" in
    28b52ffd) need_command zstd zstd; set -- zstd -dc ;;
    1f8b*) set -- gzip -dc ;;
    fd377a58) set -- xz -dc ;;
    *) say "kernel payload compression (magic $magic) not handled; booting the bzImage only"; return 0 ;;
    esac
    head -c $((start + payload_length - 4)) "$bz" | tail -c +$((start + 1)) | "$@" >"$dest.tmp"
    size=$(od -An -tu4 -j $((start + payload_length - 4)) -N4 "$bz" | tr -d ' ')
    if [ "$(stat -c %s "$dest.tmp")" != "$size" ] || [ "$(head -c 4 "$dest.tmp" | od -An -tx1 | tr -d ' ')" != 7f454c46 ]; then
        rm -f "$dest.tmp"
        die "the kernel payload of $bz did not decompress to a $size-byte ELF file"
    fi
    mv "$dest.tmp" "$dest"
}
if grep -q '^CONFIG_PVH=y' "$kdir/config" && [ ! -s "$kdir/vmlinux" ]; then
    extract_vmlinux "$kdir/vmlinuz" "$kdir/vmlinux"
fi

# Busybox (statically linked), taken out of its .deb rather than installed.
bbdir=$cache/busybox
if [ ! -x "$bbdir/bin/busybox" ]; then
    deb=$(apt_download_cached busybox-static "$cache/debs")
    rm -rf "$bbdir.tmp"
    mkdir -p "$bbdir.tmp"
    dpkg-deb -x "$deb" "$bbdir.tmp"
    rm -rf "$bbdir"
    mv "$bbdir.tmp" "$bbdir"
fi
busybox=$bbdir/bin/busybox

# Skip the initramfs when nothing that goes into it changed.
stamp=$( {
    printf 'kernel %s\n' "$kernel_pkg"
    sha256sum "$here/guest-init.sh" "$busybox" "$here/build.sh" | cut -d' ' -f1
    for ko in "$kdir"/modules/*.ko; do
        if [ -e "$ko" ]; then printf 'module %s %s\n' "${ko##*/}" "$(sha256sum <"$ko" | cut -d' ' -f1)"; fi
    done
    for b in "${bins[@]}"; do printf '%s %s\n' "${b##*/}" "$(sha256sum <"$b" | cut -d' ' -f1)"; done
} | sha256sum | cut -d' ' -f1)
if [ -s "$out/initramfs.cpio.gz" ] && [ -s "$out/vmlinuz" ] &&
    { [ -s "$out/vmlinux" ] || [ ! -s "$kdir/vmlinux" ]; } &&
    [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
    say "up to date: $out"
    exit 0
fi

root=$cache/initramfs-root
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,root,etc,sluice,lib/modules}
cp "$busybox" "$root/bin/busybox"
# One symlink per applet, where busybox expects it (bin/ls, usr/bin/awk, ...).
"$busybox" --list-full | while read -r applet; do
    [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
install -m 0755 "$here/guest-init.sh" "$root/init"
for ko in "$kdir"/modules/*.ko; do
    if [ -e "$ko" ]; then install -m 0644 "$ko" "$root/lib/modules/${ko##*/}"; fi
done
for b in "${bins[@]}"; do
    install -m 0755 "$b" "$root/bin/${b##*/}"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# Same inputs, same bytes: fixed timestamps, sorted names, root ownership.
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) |
    gzip -n -6 >"$out/initramfs.cpio.gz.tmp"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
for k in vmlinuz vmlinux; do
    rm -f "$out/$k"
    [ -s "$kdir/$k" ] || continue
    ln "$kdir/$k" "$out/$k" 2>/dev/null || cp "$kdir/$k" "$out/$k"
done

{
    echo "kernel-package $kernel_pkg"
    echo "busybox $("$busybox" | head -n 1)"
    echo "init $(sha256sum "$here/guest-init.sh" | cut -d' ' -f1)"
    for b in "${bins[@]}"; do echo "bin /bin/${b##*/} $(sha256sum "$b" | cut -d' ' -f1)"; done
    for ko in "$kdir"/modules/*.ko; do
        if [ -e "$ko" ]; then echo "module /lib/modules/${ko##*/} $(sha256sum "$ko" | cut -d' ' -f1)"; fi
    done
} >"$out/manifest.txt"
printf '%s\n' "$stamp" >"$out/.stamp"
kernels=vmlinuz
[ ! -s "$out/vmlinux" ] || kernels="vmlinuz, vmlinux"
say "built in $out: $kernels ($kver), initramfs.cpio.gz ($(du -h "$out/initramfs.cpio.gz" | cut -f1))"

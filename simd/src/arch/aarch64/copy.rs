//! Copy kernels for aarch64: a NEON `ldp`/`stp` q-register loop and an SVE
//! predicated loop, both in `asm!` (the SVE one must be: stable Rust has no
//! SVE intrinsics; the NEON one is, so that the loop is exactly the paired
//! loads and stores).

use core::arch::asm;
use core::ptr::{read_unaligned, write_unaligned};

/// Copies up to 64 bytes with two overlapping moves of the largest size
/// that fits (two pairs of q registers above 32).
///
/// # Safety
/// `src` readable and `dst` writable for `len ≤ 64` bytes, disjoint.
#[inline]
unsafe fn copy_upto64(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len <= 64);
    // SAFETY: every access stays within [0, len) of its range (widths
    // chosen by `len`), which the caller guarantees valid and disjoint.
    unsafe {
        if len > 32 {
            let a = read_unaligned(src.cast::<[u128; 2]>());
            let b = read_unaligned(src.add(len - 32).cast::<[u128; 2]>());
            write_unaligned(dst.cast::<[u128; 2]>(), a);
            write_unaligned(dst.add(len - 32).cast::<[u128; 2]>(), b);
        } else if len >= 16 {
            let a = read_unaligned(src.cast::<u128>());
            let b = read_unaligned(src.add(len - 16).cast::<u128>());
            write_unaligned(dst.cast::<u128>(), a);
            write_unaligned(dst.add(len - 16).cast::<u128>(), b);
        } else if len >= 8 {
            let a = read_unaligned(src.cast::<u64>());
            let b = read_unaligned(src.add(len - 8).cast::<u64>());
            write_unaligned(dst.cast::<u64>(), a);
            write_unaligned(dst.add(len - 8).cast::<u64>(), b);
        } else if len >= 4 {
            let a = read_unaligned(src.cast::<u32>());
            let b = read_unaligned(src.add(len - 4).cast::<u32>());
            write_unaligned(dst.cast::<u32>(), a);
            write_unaligned(dst.add(len - 4).cast::<u32>(), b);
        } else if len >= 2 {
            let a = read_unaligned(src.cast::<u16>());
            let b = read_unaligned(src.add(len - 2).cast::<u16>());
            write_unaligned(dst.cast::<u16>(), a);
            write_unaligned(dst.add(len - 2).cast::<u16>(), b);
        } else if len == 1 {
            *dst = *src;
        }
    }
}

/// NEON copy: 64 bytes per iteration with two `ldp`/`stp` q-register pairs;
/// the last 64 bytes are copied from the end (overlapping the loop's last
/// block when `len` is not a multiple of 64).
///
/// # Safety
/// The contract of `crate::copy_raw` (NEON is baseline on aarch64).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn copy_neon(dst: *mut u8, src: *const u8, len: usize) {
    if len <= 64 {
        // SAFETY: forwarded contract, len ≤ 64.
        return unsafe { copy_upto64(dst, src, len) };
    }
    let blocks = (len - 1) / 64 * 64; // ≥ 64, < len: the tail is 1..=64 bytes
    // SAFETY: the loop reads [src, src+blocks) and writes [dst, dst+blocks),
    // both inside the caller's valid, disjoint ranges since blocks < len;
    // it clobbers only the named registers and the flags.
    unsafe {
        asm!(
            "2:",
            "ldp {a:q}, {b:q}, [{s}]",
            "ldp {c:q}, {d:q}, [{s}, #32]",
            "add {s}, {s}, #64",
            "subs {n}, {n}, #64",
            "stp {a:q}, {b:q}, [{t}]",
            "stp {c:q}, {d:q}, [{t}, #32]",
            "add {t}, {t}, #64",
            "b.ne 2b",
            s = inout(reg) src => _,
            t = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a = out(vreg) _,
            b = out(vreg) _,
            c = out(vreg) _,
            d = out(vreg) _,
            options(nostack),
        );
    }
    // SAFETY: the last 64 bytes of both ranges (len > 64).
    unsafe { copy_upto64(dst.add(len - 64), src.add(len - 64), 64) }
}

/// Bytes in one SVE vector on this CPU.
///
/// # Safety
/// The CPU must support SVE.
#[target_feature(enable = "sve")]
pub(crate) unsafe fn sve_vector_bytes() -> usize {
    let n: usize;
    // SAFETY: `cntb` only reads the vector length into a general register.
    unsafe { asm!("cntb {n}", n = out(reg) n, options(pure, nomem, nostack)) };
    n
}

/// SVE copy: four whole vectors per iteration, then a `whilelo`-predicated
/// loop for the rest, so no scalar tail at any vector length.
///
/// # Safety
/// The CPU must support SVE; the contract of `crate::copy_raw`.
#[target_feature(enable = "sve")]
pub(crate) unsafe fn copy_sve(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: loads touch only [src, src+len) and stores only
    // [dst, dst+len): whole-vector iterations run while at least four
    // vectors remain, and the predicated loop's lanes are limited to
    // i < remaining by `whilelo`. The ranges are valid and disjoint (caller).
    // z0-z3 (aliasing v0-v3), p0, p1 and the flags are declared clobbered.
    unsafe {
        asm!(
            "cntb {vl}",
            "lsl {vl4}, {vl}, #2",
            "ptrue p1.b",
            "cmp {n}, {vl4}",
            "b.lo 3f",
            "2:",
            "ld1b {{z0.b}}, p1/z, [{s}]",
            "ld1b {{z1.b}}, p1/z, [{s}, #1, mul vl]",
            "ld1b {{z2.b}}, p1/z, [{s}, #2, mul vl]",
            "ld1b {{z3.b}}, p1/z, [{s}, #3, mul vl]",
            "st1b {{z0.b}}, p1, [{t}]",
            "st1b {{z1.b}}, p1, [{t}, #1, mul vl]",
            "st1b {{z2.b}}, p1, [{t}, #2, mul vl]",
            "st1b {{z3.b}}, p1, [{t}, #3, mul vl]",
            "add {s}, {s}, {vl4}",
            "add {t}, {t}, {vl4}",
            "sub {n}, {n}, {vl4}",
            "cmp {n}, {vl4}",
            "b.hs 2b",
            "3:",
            "mov {i}, #0",
            "whilelo p0.b, {i}, {n}",
            "b.eq 5f",
            "4:",
            "ld1b {{z0.b}}, p0/z, [{s}, {i}]",
            "st1b {{z0.b}}, p0, [{t}, {i}]",
            "incb {i}",
            "whilelo p0.b, {i}, {n}",
            "b.mi 4b",
            "5:",
            s = inout(reg) src => _,
            t = inout(reg) dst => _,
            n = inout(reg) len => _,
            i = out(reg) _,
            vl = out(reg) _,
            vl4 = out(reg) _,
            out("v0") _,
            out("v1") _,
            out("v2") _,
            out("v3") _,
            out("p0") _,
            out("p1") _,
            options(nostack),
        );
    }
}

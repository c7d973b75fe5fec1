//! How a slice maps onto block objects, and the objects' keys.
//!
//! A slice of `size` bytes is stored as blocks of the volume's block size;
//! block `i` of slice `id` is the object
//! `NAME/chunks/{id / 1_000_000}/{id / 1000}/{id}_{i}_{bsize}` where `bsize`
//! is the size of *that block* (the last block of a slice is shorter).
//! Verified on JuiceFS 1.4.2: a 10 498 105-byte slice 3 became `3_0_4194304`,
//! `3_1_4194304` and `3_2_2109497`.

/// The key of block `indx` of slice `id`, whose own (raw) size is `bsize`.
pub fn block_key(volume: &str, id: u64, indx: u32, bsize: u32) -> String {
    format!(
        "{volume}/chunks/{}/{}/{id}_{indx}_{bsize}",
        id / 1_000_000,
        id / 1000
    )
}

/// The key prefix under which all block objects of a volume live.
pub fn chunks_prefix(volume: &str) -> String {
    format!("{volume}/chunks/")
}

/// The (slice id, block index, block size) a block key names, if it is one.
pub fn parse_block_key(key: &str) -> Option<(u64, u32, u32)> {
    let name = key.rsplit('/').next()?;
    let mut it = name.split('_');
    let id = it.next()?.parse().ok()?;
    let indx = it.next()?.parse().ok()?;
    let bsize = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((id, indx, bsize))
}

/// The raw size of block `indx` of a slice of `slice_size` bytes.
pub fn block_len(slice_size: u32, block_size: u32, indx: u32) -> u32 {
    let start = u64::from(indx) * u64::from(block_size);
    (u64::from(slice_size).saturating_sub(start)).min(u64::from(block_size)) as u32
}

/// How many blocks a slice of `slice_size` bytes has.
pub fn block_count(slice_size: u32, block_size: u32) -> u32 {
    slice_size.div_ceil(block_size)
}

/// Every object key of a slice, in block order.
pub fn slice_keys(volume: &str, id: u64, slice_size: u32, block_size: u32) -> Vec<String> {
    (0..block_count(slice_size, block_size))
        .map(|i| block_key(volume, id, i, block_len(slice_size, block_size, i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_juicefs() {
        const BS: u32 = 4 << 20;
        assert_eq!(
            slice_keys("volnone", 3, 10_498_105, BS),
            [
                "volnone/chunks/0/0/3_0_4194304",
                "volnone/chunks/0/0/3_1_4194304",
                "volnone/chunks/0/0/3_2_2109497"
            ]
        );
        assert_eq!(
            block_key("v", 12_345_678, 2, 7),
            "v/chunks/12/12345/12345678_2_7"
        );
        assert_eq!(
            parse_block_key("v/chunks/12/12345/12345678_2_7"),
            Some((12_345_678, 2, 7))
        );
        assert_eq!(parse_block_key("v/chunks/0/0/.1_0_3.tmp5"), None);
        assert_eq!(parse_block_key("v/juicefs_uuid"), None);
        assert_eq!(block_count(0, BS), 0);
        assert_eq!(block_count(BS, BS), 1);
        assert_eq!(block_len(BS + 1, BS, 1), 1);
    }
}

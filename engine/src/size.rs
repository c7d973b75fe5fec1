//! Byte sizes as operators write them, one meaning for every flag and
//! setting of the program: `4096`, `128K`, `300M`, `100G`, `1.5T`, `1MiB`,
//! `105GB`.
//!
//! - `K`, `M`, `G`, `T`, `P`, `E` (either case, as JuiceFS reads them) and
//!   `KiB` … `EiB` are powers of 1024: `1G` is 1073741824 bytes.
//! - `KB`, `MB`, `GB`, `TB`, `PB`, `EB` are powers of 1000 (as disks and
//!   MLPerf's checkpoint sizes count): `1GB` is 1000000000 bytes. JuiceFS
//!   refuses these; every size JuiceFS accepts means the same bytes here.
//! - `B` is bytes; a bare number is in the flag's own unit ([`Unit`]), as
//!   each JuiceFS flag has one (`--cache-size 1024` is MiB, `--capacity 10`
//!   GiB, `--block-size 4096` KiB).
//!
//! A fraction is allowed (`1.5G`) and rounded down to whole bytes, as
//! JuiceFS does; signs, exponents and anything else are refused, and so is
//! a size past the flag's range ([`SizeRange`]), with a message that names
//! the size in bytes.

/// What a bare number means for one flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// KiB (1024 bytes).
    Kib,
    /// MiB.
    Mib,
    /// GiB.
    Gib,
}

impl Unit {
    /// Bytes in one of the unit.
    pub fn bytes(self) -> u64 {
        match self {
            Unit::Bytes => 1,
            Unit::Kib => 1 << 10,
            Unit::Mib => 1 << 20,
            Unit::Gib => 1 << 30,
        }
    }

    /// The unit's name in messages and `--help`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Kib => "KiB",
            Unit::Mib => "MiB",
            Unit::Gib => "GiB",
        }
    }
}

/// The sizes one flag takes, both ends included, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeRange {
    /// The smallest.
    pub min: u64,
    /// The largest.
    pub max: u64,
}

impl SizeRange {
    /// Every size that fits in 64 bits.
    pub const ANY: SizeRange = SizeRange {
        min: 0,
        max: u64::MAX,
    };

    /// From `min` to `max` bytes.
    pub const fn new(min: u64, max: u64) -> SizeRange {
        SizeRange { min, max }
    }
}

/// Why a size was refused; the message says what was given and what is
/// taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a size at all.
    #[error(
        "{input:?} is not a size: write a number with a unit, such as 512K, 300M, 100G or 1.5T \
         (K, M, G, T, P, E and KiB, MiB, ... are powers of 1024, as in JuiceFS; KB, MB, GB, ... \
         powers of 1000; a bare number is {bare})"
    )]
    Syntax {
        /// What was given.
        input: String,
        /// The unit of a bare number.
        bare: &'static str,
    },
    /// Too large for the flag (or for 64 bits).
    #[error("{input:?} is {}, more than the most this takes, {}", show(*.bytes), format_size(*.max))]
    TooLarge {
        /// What was given.
        input: String,
        /// What it comes to.
        bytes: u128,
        /// The largest size taken.
        max: u64,
    },
    /// Too small for the flag.
    #[error("{input:?} is {}, less than the least this takes, {}", show(*.bytes), format_size(*.min))]
    TooSmall {
        /// What was given.
        input: String,
        /// What it comes to.
        bytes: u128,
        /// The smallest size taken.
        min: u64,
    },
}

fn show(bytes: u128) -> String {
    match u64::try_from(bytes) {
        Ok(b) => format_size(b),
        Err(_) => "more than 16 EiB".into(),
    }
}

/// Parses a size (see the module's documentation); a bare number is in
/// `bare`; the result must lie in `range`.
pub fn parse_size(input: &str, bare: Unit, range: SizeRange) -> Result<u64, SizeError> {
    let syntax = || SizeError::Syntax {
        input: input.to_string(),
        bare: bare.name(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || fraction.contains('.')
        || fraction.len() > 18
        || whole.len() > 38
    {
        return Err(syntax());
    }
    let multiplier: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => u128::from(bare.bytes()),
        "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "e" | "eib" => 1 << 60,
        "kb" => 10u128.pow(3),
        "mb" => 10u128.pow(6),
        "gb" => 10u128.pow(9),
        "tb" => 10u128.pow(12),
        "pb" => 10u128.pow(15),
        "eb" => 10u128.pow(18),
        _ => return Err(syntax()),
    };
    // Exact: (whole + fraction / 10^d) * multiplier, rounded down. What
    // does not fit in 128 bits saturates, and is refused as too large.
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| syntax())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let frac: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| syntax())?
    };
    let bytes = whole
        .saturating_mul(multiplier)
        .saturating_add(frac.saturating_mul(multiplier) / scale);
    if bytes > u128::from(range.max) {
        return Err(SizeError::TooLarge {
            input: input.to_string(),
            bytes,
            max: range.max,
        });
    }
    if bytes < u128::from(range.min) {
        return Err(SizeError::TooSmall {
            input: input.to_string(),
            bytes,
            min: range.min,
        });
    }
    Ok(bytes as u64)
}

/// A `clap` value parser for a size flag: `bare` for a bare number, sizes
/// in `range` only; the value is in bytes.
pub fn size_parser(
    bare: Unit,
    range: SizeRange,
) -> impl Fn(&str) -> Result<u64, SizeError> + Clone + Send + Sync + 'static {
    move |s: &str| parse_size(s, bare, range)
}

/// Formats a byte count for people: `512 B`, `1.50 GiB`, `16.00 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// A byte count that may have to be compared exactly (a mismatch to
/// repair): `1.50 MiB (1572864 bytes)`, or `512 B` when that is exact.
pub fn format_size_exact(bytes: u64) -> String {
    if bytes < 1024 {
        format_size(bytes)
    } else {
        format!("{} ({bytes} bytes)", format_size(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(s: &str, bare: Unit) -> Result<u64, SizeError> {
        parse_size(s, bare, SizeRange::ANY)
    }

    #[test]
    fn units_mean_what_juicefs_means_and_decimal_ones_are_decimal() {
        assert_eq!(any("4096", Unit::Bytes), Ok(4096));
        assert_eq!(any("128K", Unit::Bytes), Ok(128 << 10));
        assert_eq!(any("128k", Unit::Bytes), Ok(128 << 10));
        assert_eq!(any("300M", Unit::Bytes), Ok(300 << 20));
        assert_eq!(any("100G", Unit::Bytes), Ok(100 << 30));
        assert_eq!(any("2T", Unit::Bytes), Ok(2 << 40));
        assert_eq!(any("1P", Unit::Bytes), Ok(1 << 50));
        assert_eq!(any("1E", Unit::Bytes), Ok(1 << 60));
        assert_eq!(any("1MiB", Unit::Bytes), Ok(1 << 20));
        assert_eq!(any("1 GiB", Unit::Bytes), Ok(1 << 30));
        assert_eq!(any("105GB", Unit::Bytes), Ok(105_000_000_000));
        assert_eq!(any("1gb", Unit::Bytes), Ok(1_000_000_000));
        assert_eq!(any("4KB", Unit::Bytes), Ok(4000));
        assert_eq!(any("7B", Unit::Mib), Ok(7));
        assert_eq!(any("1.5G", Unit::Bytes), Ok(3 << 29));
        assert_eq!(any(".5K", Unit::Bytes), Ok(512));
        assert_eq!(any("0.3K", Unit::Bytes), Ok(307), "rounded down");
    }

    #[test]
    fn a_bare_number_is_in_the_flags_unit() {
        assert_eq!(any("1024", Unit::Mib), Ok(1 << 30));
        assert_eq!(any("4096", Unit::Kib), Ok(4 << 20));
        assert_eq!(any("0.5", Unit::Gib), Ok(512 << 20));
        assert_eq!(any("0", Unit::Gib), Ok(0));
    }

    #[test]
    fn garbage_and_out_of_range_sizes_are_refused_with_their_reason() {
        for bad in [
            "",
            "-1",
            "+1",
            "1e3",
            "0x10",
            "1.2.3",
            ".",
            "12 parsecs",
            "G",
            "1Gi",
        ] {
            let err = any(bad, Unit::Mib).unwrap_err();
            assert!(matches!(err, SizeError::Syntax { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("bare number is MiB"), "{err}");
        }
        let err = any("99999999999999999999E", Unit::Bytes).unwrap_err();
        assert!(matches!(err, SizeError::TooLarge { .. }), "{err}");
        assert!(any("16E", Unit::Bytes).is_err(), "2^64 does not fit");
        assert_eq!(any("15E", Unit::Bytes), Ok(15 << 60));
        let range = SizeRange::new(1 << 20, 1 << 30);
        let err = parse_size("2G", Unit::Mib, range).unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"2G\" is 2.00 GiB, more than the most this takes, 1.00 GiB"
        );
        let err = parse_size("4K", Unit::Mib, range).unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"4K\" is 4.00 KiB, less than the least this takes, 1.00 MiB"
        );
        assert_eq!(parse_size("1G", Unit::Mib, range), Ok(1 << 30));
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(16 << 20), "16.00 MiB");
        assert_eq!(format_size(u64::MAX), "16.00 EiB");
        assert_eq!(format_size(1 << 40), "1.00 TiB");
        assert_eq!(format_size_exact(1000), "1000 B");
        assert_eq!(format_size_exact(3 << 19), "1.50 MiB (1572864 bytes)");
    }
}

//! Human byte sizes on the command line: `4096`, `128K`, `1MiB`, `105GB`, `5.29T`.

/// The error for a size string that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read {input:?} as a size: use a number with an optional unit such as 128K, 1MiB or 105GB"
)]
pub struct SizeError {
    /// What the user wrote.
    pub input: String,
}

/// Parses a byte size. `K/M/G/T` and `KiB/MiB/...` are powers of 1024; `KB/MB/GB/TB` are
/// powers of 1000 (as disk vendors and MLPerf's checkpoint sizes use them); no unit is bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = || SizeError {
        input: input.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(err()),
    };
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Formats a byte count for people: `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("128K").unwrap(), 128 * 1024);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("105GB").unwrap(), 105_000_000_000);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_size("").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}

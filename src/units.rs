//! Sizes and counts for people, in and out: `1.50 GiB`, `512MiB`, `1.5GB`, `7B`, `1e9`.

use crate::Error;

const BINARY: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const DECIMAL: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];

/// Formats a byte count with binary units and three significant digits.
///
/// ```
/// use autobatch::format_bytes;
/// assert_eq!(format_bytes(730), "730 B");
/// assert_eq!(format_bytes(1536), "1.50 KiB");
/// assert_eq!(format_bytes(16 << 30), "16.0 GiB");
/// assert_eq!(format_bytes(150 << 20), "150 MiB");
/// ```
pub fn format_bytes(bytes: u64) -> String {
    three_significant_digits(bytes, 1024.0, &BINARY)
}

/// Formats a byte count with decimal units (as model-memory rules of thumb
/// are quoted: "16 GB for 1e9 parameters with Adam") and three significant digits.
///
/// ```
/// use autobatch::format_bytes_decimal;
/// assert_eq!(format_bytes_decimal(16_000_000_000), "16.0 GB");
/// assert_eq!(format_bytes_decimal(2_030_000_000), "2.03 GB");
/// assert_eq!(format_bytes_decimal(999), "999 B");
/// ```
pub fn format_bytes_decimal(bytes: u64) -> String {
    three_significant_digits(bytes, 1000.0, &DECIMAL)
}

fn three_significant_digits(bytes: u64, base: f64, units: &[&str]) -> String {
    if (bytes as f64) < base {
        return format!("{bytes} B");
    }
    let (mut value, mut unit) = (bytes as f64 / base, 1);
    // 999.5 and up would print as 1000: show it in the next unit instead
    while value >= 999.5 && unit < units.len() - 1 {
        value /= base;
        unit += 1;
    }
    let decimals = if value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {}", units[unit])
}

const SIZE_UNITS: &str = "B, kB/KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";

/// Parses a byte size: a number with an optional unit, decimal (`kB`/`KB`, `MB`,
/// `GB`, `TB`) or binary (`KiB`, `MiB`, `GiB`, `TiB`), case-insensitive, with or
/// without a space. A bare number is bytes.
///
/// ```
/// use autobatch::parse_bytes;
/// assert_eq!(parse_bytes("4GiB")?, 4 << 30);
/// assert_eq!(parse_bytes("512 MiB")?, 512 << 20);
/// assert_eq!(parse_bytes("1.5GB")?, 1_500_000_000);
/// assert_eq!(parse_bytes("1048576")?, 1 << 20);
/// assert!(parse_bytes("12 gigs").is_err());
/// # Ok::<(), autobatch::Error>(())
/// ```
pub fn parse_bytes(input: &str) -> Result<u64, Error> {
    let invalid = |reason: String| Error::InvalidSize { input: input.to_owned(), reason };
    let (number, unit) = split_number(input.trim());
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(invalid(format!("unknown unit {unit:?}: use {SIZE_UNITS}"))),
    };
    scaled(number, scale).map_err(|reason| invalid(format!("{reason}; e.g. 4GiB, 512MiB or 1.5GB")))
}

/// Parses a count such as a number of parameters: `1e9`, `125M`, `7B`,
/// `1.5k`, `350000` (suffixes `k`/`K` = 10³, `M` = 10⁶, `B`/`G` = 10⁹, `T` = 10¹²).
///
/// ```
/// use autobatch::parse_count;
/// assert_eq!(parse_count("1e9")?, 1_000_000_000);
/// assert_eq!(parse_count("125M")?, 125_000_000);
/// assert_eq!(parse_count("7B")?, 7_000_000_000);
/// assert_eq!(parse_count("1.3b")?, 1_300_000_000);
/// assert!(parse_count("-5").is_err());
/// # Ok::<(), autobatch::Error>(())
/// ```
pub fn parse_count(input: &str) -> Result<u64, Error> {
    let invalid = |reason: String| Error::InvalidCount { input: input.to_owned(), reason };
    let (number, suffix) = split_number(input.trim());
    let scale: u64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" | "m" => 1_000_000,
        "B" | "b" | "G" | "g" => 1_000_000_000,
        "T" | "t" => 1_000_000_000_000,
        _ => return Err(invalid(format!("unknown suffix {suffix:?}: use k, M, B (or G), T, or an exponent like 1e9"))),
    };
    scaled(number, scale).map_err(|reason| invalid(format!("{reason}; e.g. 1e9, 125M or 7B")))
}

/// Splits `"1.5 GiB"` into `("1.5", "GiB")`; exponents stay with the number.
fn split_number(input: &str) -> (&str, &str) {
    let bytes = input.as_bytes();
    let mut end = 0;
    while end < bytes.len() {
        let c = bytes[end];
        let exponent = (c == b'e' || c == b'E')
            && end > 0
            && bytes.get(end + 1).is_some_and(|n| n.is_ascii_digit() || *n == b'+' || *n == b'-');
        let sign_of_exponent = (c == b'+' || c == b'-') && end > 0 && matches!(bytes[end - 1], b'e' | b'E');
        if c.is_ascii_digit() || c == b'.' || exponent || sign_of_exponent || (end == 0 && (c == b'-' || c == b'+')) {
            end += 1;
        } else {
            break;
        }
    }
    (&input[..end], input[end..].trim_start())
}

fn scaled(number: &str, scale: u64) -> Result<u64, String> {
    if number.is_empty() {
        return Err("no number".to_owned());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(scale).ok_or_else(|| "too large".to_owned());
    }
    let value: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let total = value * scale as f64;
    if !total.is_finite() || total < 0.0 {
        return Err("must be a finite, non-negative number".to_owned());
    }
    if total >= u64::MAX as f64 {
        return Err("too large".to_owned());
    }
    Ok(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_counts() {
        let sizes = [
            ("4GiB", 4u64 << 30),
            ("4 gib", 4 << 30),
            ("0.5 GiB", 512 << 20),
            ("1.5GB", 1_500_000_000),
            ("12GB", 12_000_000_000),
            ("100kB", 100_000),
            ("100KB", 100_000),
            ("7", 7),
            ("7B", 7),
            ("2e3 MiB", 2000 << 20),
        ];
        for (input, want) in sizes {
            assert_eq!(parse_bytes(input).unwrap(), want, "{input}");
        }
        for bad in ["", "GiB", "4 GiBs", "-1GB", "1e400GB", "four GB", "nan GB", "inf"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidSize { .. }), "{bad}: {err}");
        }
        let counts =
            [("1e9", 1_000_000_000u64), ("125M", 125_000_000), ("7B", 7_000_000_000), ("350k", 350_000), ("42", 42)];
        for (input, want) in counts {
            assert_eq!(parse_count(input).unwrap(), want, "{input}");
        }
        for bad in ["", "7X", "-3", "1..2", "B"] {
            assert!(matches!(parse_count(bad), Err(Error::InvalidCount { .. })), "{bad}");
        }
    }

    #[test]
    fn decimal_and_binary_round_trip_through_text() {
        for bytes in [1u64 << 30, 3 << 29, 150 << 20] {
            assert_eq!(parse_bytes(&format_bytes(bytes).replace(' ', "")).unwrap(), bytes);
        }
    }

    #[test]
    fn formats_each_magnitude_with_three_significant_digits() {
        let cases: [(u64, &str); 9] = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (10 * 1024, "10.0 KiB"),
            (100 * 1024, "100 KiB"),
            ((1 << 30) - 1024 * 1024, "1.00 GiB"),
            (3 * (1 << 29), "1.50 GiB"),
            (141 * (1 << 30), "141 GiB"),
            (u64::MAX, "16.0 EiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(format_bytes(bytes), want, "{bytes} bytes");
        }
    }
}

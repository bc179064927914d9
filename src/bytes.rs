//! Byte counts for people: `1.50 GiB`, `512.0 MiB`, `730 B`.

const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

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
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    // Rounding can carry a value to 1024 (e.g. 1023.99 MiB): show it in the next unit.
    if value >= 999.5 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let decimals = if value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

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

//! Byte counts and times for people: `1.50 GiB`, `16.0 GB`, `0.200 s`. A
//! leaf: it imports nothing from the crate.

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

/// A time in milliseconds in seconds: `3 s`, `0.200 s`.
/// A fraction as a percentage: whole where it is whole (`90%`), else to a
/// tenth (`85.5%`).
pub(crate) fn format_percent(fraction: f64) -> String {
    let percent = 100.0 * fraction;
    if (percent - percent.round()).abs() < 0.05 {
        format!("{percent:.0}%")
    } else {
        format!("{percent:.1}%")
    }
}

pub(crate) fn format_millis(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        format!("{} s", millis / 1000)
    } else {
        format!("{:.3} s", millis as f64 / 1000.0)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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

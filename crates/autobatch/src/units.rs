//! Byte counts and times for people: `1.50 GiB`, `16.0 GB`, `0.200 s`. A
//! leaf: it imports nothing from the crate.

const BINARY: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const DECIMAL: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];

/// A byte count for people: binary units and three significant digits
/// (`1.50 GiB`) as its `Display`, decimal units (`16.0 GB`, as model-memory
/// rules of thumb are quoted: "16 GB for 1e9 parameters with Adam") through
/// [`decimal`](Bytes::decimal).
///
/// ```
/// use autobatch::Bytes;
/// assert_eq!(Bytes(730).to_string(), "730 B");
/// assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
/// assert_eq!(Bytes(16 << 30).to_string(), "16.0 GiB");
/// assert_eq!(format!("peak {}", Bytes(150 << 20)), "peak 150 MiB");
/// assert_eq!(Bytes(16_000_000_000).decimal().to_string(), "16.0 GB");
/// assert_eq!(Bytes(2_030_000_000).decimal().to_string(), "2.03 GB");
/// assert_eq!(Bytes(999).decimal().to_string(), "999 B");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub u64);

impl Bytes {
    /// The count in decimal units: `16.0 GB`.
    pub fn decimal(self) -> impl std::fmt::Display {
        Decimal(self.0)
    }
}

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&three_significant_digits(self.0, 1024.0, &BINARY))
    }
}

/// [`Bytes::decimal`].
struct Decimal(u64);

impl std::fmt::Display for Decimal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&three_significant_digits(self.0, 1000.0, &DECIMAL))
    }
}

/// [`Bytes`] as text.
pub(crate) fn format_bytes(bytes: u64) -> String {
    Bytes(bytes).to_string()
}

/// A fraction as a percentage: whole where it is whole (`90%`), else to a
/// tenth (`85.5%`).
/// Samples per second to two significant figures below 10 (a slow step's
/// 0.25, not 0), whole above.
pub(crate) fn format_rate(rate: f64) -> String {
    if rate >= 10.0 {
        format!("{rate:.0}")
    } else if rate >= 1.0 {
        format!("{rate:.1}")
    } else if rate > 0.0 && rate.is_finite() {
        // two significant digits however slow the step: a step of minutes is not "0.00"
        let decimals = (1.0 - rate.log10().floor()).clamp(2.0, 12.0) as usize;
        format!("{rate:.decimals$}")
    } else {
        format!("{rate:.2}")
    }
}

pub(crate) fn format_percent(fraction: f64) -> String {
    let percent = 100.0 * fraction;
    if (percent - percent.round()).abs() < 0.05 { format!("{percent:.0}%") } else { format!("{percent:.1}%") }
}

/// A time in milliseconds in seconds: `3 s`, `0.200 s`.
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
    fn a_slow_step_shows_its_rate_not_zero() {
        assert_eq!(format_rate(0.25), "0.25");
        assert_eq!(format_rate(2.71), "2.7");
        assert_eq!(format_rate(1234.4), "1234");
        // a step of minutes: still two significant digits, not 0.00
        assert_eq!(format_rate(0.004), "0.0040");
        assert_eq!(format_rate(0.0123), "0.012");
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

    #[test]
    fn both_unit_families_pad_to_a_width_as_text_does() {
        assert_eq!(format!("[{:>10}]", Bytes(1536)), "[  1.50 KiB]");
        assert_eq!(format!("[{:<10}]", Bytes(1536)), "[1.50 KiB  ]");
        assert_eq!(format!("[{:>9}]", Bytes(16_000_000_000).decimal()), "[  16.0 GB]");
        assert_eq!(format!("{}", Bytes(999).decimal()), "999 B");
    }
}

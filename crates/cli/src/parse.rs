//! Sizes and counts as people type them: `4GiB`, `512 MiB`, `1.5GB`, `7B`, `1e9`.
//!
//! Read exactly, in integers: `1.3B` is 1,300,000,000, not the nearest float.
//! A size with a fraction of a byte (`11.2GiB` is 12,025,908,428.8 bytes) is
//! rounded down to whole bytes, and says so; a count that is not whole
//! (`0.5` parameters), a negative value, one that does not fit in 64 bits, or
//! one that is not a finite number (`NaN`, `inf`) is an error.

/// Why a size or a count could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A byte size could not be read.
    #[error(
        "invalid size {input:?}: {reason}; a size is a number and a unit ({SIZE_UNITS}), e.g. 4GiB, 512MiB or 1.5GB"
    )]
    Size {
        /// The text given.
        input: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A count could not be read.
    #[error("invalid count {input:?}: {reason}; e.g. 1e9, 125M or 7B")]
    Count {
        /// The text given.
        input: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
}

const SIZE_UNITS: &str = "B, kB/KB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024)";

/// Parses a byte size: a number with an optional unit, decimal (`kB`/`KB`, `MB`,
/// `GB`, `TB`, `PB`) or binary (`KiB` … `PiB`), case-insensitive, with or
/// without a space. A bare number is bytes.
pub fn parse_bytes(input: &str) -> Result<u64, ParseError> {
    let invalid = |reason: String| ParseError::Size { input: input.to_owned(), reason };
    let (number, unit) = split_number(input.trim());
    if let Some(reason) = not_finite(number, unit) {
        return Err(invalid(reason));
    }
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "pib" => 1 << 50,
        _ => return Err(invalid(format!("unknown unit {unit:?}"))),
    };
    let (bytes, rounded) = exact(number, scale, Rounding::Down).map_err(|why| invalid(why.say("16 EiB")))?;
    if rounded {
        note(format!("{} is not a whole number of bytes: rounded down to {bytes} bytes", input.trim()));
    }
    Ok(bytes)
}

/// What reading the flags noticed and the user should hear (a size rounded
/// down): flags are read before logging is set up, so it is kept here until
/// [`notes`] hands it to the log.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(text: String) {
    NOTES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(text);
}

/// What reading the flags noticed, once: for `main` to log as warnings.
pub fn notes() -> Vec<String> {
    std::mem::take(&mut *NOTES.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

/// Why text that starts like a number is not one: `NaN`, `inf`, `infinity`.
fn not_finite(number: &str, unit: &str) -> Option<String> {
    let word = unit.to_ascii_lowercase();
    let infinite = ["inf", "infinity"].iter().any(|w| word.starts_with(w));
    match (number.trim_start_matches(['+', '-']).is_empty(), word.starts_with("nan"), infinite) {
        (true, true, _) => Some("NaN is not a number".to_owned()),
        (true, _, true) => Some("an infinite value is not a size".to_owned()),
        (true, _, _) => Some("no number".to_owned()),
        _ => None,
    }
}

/// Parses a count such as a number of parameters: `1e9`, `125M`, `7B`,
/// `1.5k`, `350000` (suffixes `k`/`K` = 10³, `M` = 10⁶, `B`/`G` = 10⁹, `T` = 10¹²).
pub fn parse_count(input: &str) -> Result<u64, ParseError> {
    let invalid = |reason: String| ParseError::Count { input: input.to_owned(), reason };
    let (number, suffix) = split_number(input.trim());
    let scale: u64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" | "m" => 1_000_000,
        "B" | "b" | "G" | "g" => 1_000_000_000,
        "T" | "t" => 1_000_000_000_000,
        _ => return Err(invalid(format!("unknown suffix {suffix:?}: use k, M, B (or G), T, or an exponent like 1e9"))),
    };
    if let Some(reason) = not_finite(number, suffix) {
        return Err(invalid(reason));
    }
    exact(number, scale, Rounding::Refuse)
        .map(|(count, _)| count)
        .map_err(|why| invalid(why.say("18446744073709551615")))
}

/// Parses a duration as people type it: `30s`, `1.5s`, `500ms`, `2m`, `1h`
/// (a bare number is seconds), exact to the millisecond; at least 1 ms.
pub fn parse_duration(input: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = split_number(input.trim());
    let scale: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ if not_finite(number, unit).is_some() => 1,
        _ => return Err(format!("invalid duration {input:?}: unknown unit {unit:?}; use ms, s, m or h, e.g. 30s")),
    };
    if let Some(reason) = not_finite(number, unit) {
        return Err(format!("invalid duration {input:?}: {reason}; e.g. 30s, 500ms or 2m"));
    }
    let millis = exact(number, scale, Rounding::Refuse)
        .map(|(millis, _)| millis)
        .map_err(|why| why.say("18446744073709551615 ms (584 million years)"))
        .map_err(|reason| format!("invalid duration {input:?}: {reason}; e.g. 30s, 500ms or 2m"))?;
    if millis == 0 {
        return Err(format!("invalid duration {input:?}: must be at least 1ms"));
    }
    Ok(std::time::Duration::from_millis(millis))
}

/// A byte count as a flag takes it, never more than `bytes`: `11.4GiB`
/// (three significant digits, rounded down, no space), so that advice such as
/// "use at most --budget 11.4GiB" can be pasted as it is.
pub fn flag_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes}B");
    }
    let whole = bytes >> (10 * unit);
    let decimals: u32 = if whole >= 100 {
        0
    } else if whole >= 10 {
        1
    } else {
        2
    };
    // in integers: a float of a count near 2^64 rounds up
    let scaled = (u128::from(bytes) * 10u128.pow(decimals)) >> (10 * unit);
    let (integer, fraction) = (scaled / 10u128.pow(decimals), scaled % 10u128.pow(decimals));
    match decimals {
        0 => format!("{integer}{}", UNITS[unit]),
        _ => format!("{integer}.{fraction:0width$}{}", UNITS[unit], width = decimals as usize),
    }
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

/// What to do with a value that is not whole in the unit it is counted in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rounding {
    /// Round down (a size: the fraction of a byte goes).
    Down,
    /// An error (a count, milliseconds).
    Refuse,
}

/// Why a number could not be read.
enum Invalid {
    NoNumber,
    Negative,
    NotANumber(String),
    NotWhole,
    TooLarge,
}

impl Invalid {
    /// In words; `most` is the largest value there is.
    fn say(&self, most: &str) -> String {
        match self {
            Invalid::NoNumber => "no number".to_owned(),
            Invalid::Negative => "must not be negative".to_owned(),
            Invalid::NotANumber(number) => format!("{number:?} is not a number"),
            Invalid::NotWhole => "is not a whole number".to_owned(),
            Invalid::TooLarge => format!("too large: at most {most}"),
        }
    }
}

/// `number × scale` computed exactly, as a whole `u64`, and whether a
/// fraction was rounded off.
fn exact(number: &str, scale: u64, rounding: Rounding) -> Result<(u64, bool), Invalid> {
    if number.is_empty() {
        return Err(Invalid::NoNumber);
    }
    let unsigned = match number.as_bytes()[0] {
        b'-' => return Err(Invalid::Negative),
        b'+' => &number[1..],
        _ => number,
    };
    let not_a_number = || Invalid::NotANumber(number.to_owned());
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i32>().map_err(|_| not_a_number())?),
        None => (unsigned, 0),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{integer}{fraction}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_a_number());
    }
    let digits = digits.trim_start_matches('0');
    // more significant digits than u64 has means too large, unless they are
    // all below the decimal point; 38 digits leave room for the fraction
    let significant = digits.trim_end_matches('0');
    let trailing_zeros = (digits.len() - significant.len()) as i64;
    if significant.is_empty() {
        return Ok((0, false));
    }
    if significant.len() > 38 {
        return Err(Invalid::TooLarge);
    }
    let mut value: u128 = significant.parse().map_err(|_| not_a_number())?;
    let mut power = i64::from(exponent) - fraction.len() as i64 + trailing_zeros;
    value = value.checked_mul(u128::from(scale)).ok_or(Invalid::TooLarge)?;
    while power > 0 {
        value = value.checked_mul(10).ok_or(Invalid::TooLarge)?;
        power -= 1;
    }
    let mut rounded = false;
    while power < 0 {
        if !value.is_multiple_of(10) {
            if rounding == Rounding::Refuse {
                return Err(Invalid::NotWhole);
            }
            rounded = true;
        }
        value /= 10;
        power += 1;
    }
    u64::try_from(value).map(|value| (value, rounded)).map_err(|_| Invalid::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        use std::time::Duration;
        for (text, millis) in [
            ("30s", 30_000),
            ("1.5s", 1_500),
            ("500ms", 500),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("3", 3_000),
            ("0.001", 1),
        ] {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(millis)), "{text}");
        }
        for bad in ["", "s", "-3s", "0s", "1.0005s", "3 days", "1e30s", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

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
            ("1024TiB", 1 << 50),
            ("0", 0),
            ("18446744073709551615", u64::MAX),
            // a fraction of a byte is rounded down
            ("11.2GiB", 12_025_908_428),
            ("0.5", 0),
            ("1.5", 1),
        ];
        for (input, want) in sizes {
            assert_eq!(parse_bytes(input).unwrap(), want, "{input}");
        }
        for bad in [
            "", "GiB", "4 GiBs", "-1GB", "-5MiB", "1e400GB", "four GB", "nan GB", "inf", "NaN", "infGiB", "16EiB",
            "1e20",
        ] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(matches!(err, ParseError::Size { .. }), "{bad}: {err}");
        }
        let counts = [
            ("1e9", 1_000_000_000u64),
            ("125M", 125_000_000),
            ("7B", 7_000_000_000),
            ("1.3b", 1_300_000_000),
            ("350k", 350_000),
            ("42", 42),
            ("1e19", 10_000_000_000_000_000_000),
            ("2.5e-1k", 250),
        ];
        for (input, want) in counts {
            assert_eq!(parse_count(input).unwrap(), want, "{input}");
        }
        for bad in ["", "7X", "-3", "1..2", "B", "0.5", "1.5", "1e-1", "2e19", "1e20"] {
            assert!(matches!(parse_count(bad), Err(ParseError::Count { .. })), "{bad}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse_count("0.5").unwrap_err().to_string().contains("is not a whole number"));
        assert!(parse_bytes("-5MiB").unwrap_err().to_string().contains("must not be negative"));
        assert!(parse_count("1e20").unwrap_err().to_string().contains("too large"));
        assert!(parse_bytes("NaN").unwrap_err().to_string().contains("NaN is not a number"));
        assert!(parse_bytes("infGiB").unwrap_err().to_string().contains("an infinite value is not a size"));
        assert!(parse_bytes("1e20").unwrap_err().to_string().contains("too large: at most 16 EiB"));
        let too_long = parse_duration("99999999999999999999s").unwrap_err();
        assert!(too_long.contains("too large: at most 18446744073709551615 ms (584 million years)"), "{too_long}");
        // every size error names the accepted forms
        for bad in ["12 gigs", "NaN", "-1GB", "1e400GB"] {
            let err = parse_bytes(bad).unwrap_err().to_string();
            assert!(err.contains("KiB, MiB, GiB") && err.contains("e.g. 4GiB"), "{bad}: {err}");
        }
    }

    #[test]
    fn advice_in_bytes_pastes_as_a_flag_and_never_rounds_up() {
        for bytes in [1u64, 1023, 1024, 12_240_000_000, 11 << 30, (1 << 30) - 1, 999 << 20, u64::MAX] {
            let text = flag_bytes(bytes);
            assert!(!text.contains(' '), "{text}");
            let back = parse_bytes(&text).unwrap();
            assert!(back <= bytes && back as f64 >= bytes as f64 * 0.99, "{bytes} -> {text} -> {back}");
        }
        assert_eq!(flag_bytes(12_240_000_000), "11.3GiB");
    }

    #[test]
    fn decimal_and_binary_round_trip_through_text() {
        for bytes in [1u64 << 30, 3 << 29, 150 << 20] {
            assert_eq!(parse_bytes(&autobatch::Bytes(bytes).to_string().replace(' ', "")).unwrap(), bytes);
        }
    }
}

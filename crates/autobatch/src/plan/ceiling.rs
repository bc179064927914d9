//! The utilization ceiling and the byte limit it sets.

/// A utilization ceiling: the most a fitting step may use, as a fraction in
/// (0, 1] of a device's capacity. Checked once, turned into bytes one way.
///
/// ```
/// use autobatch::plan::Ceiling;
///
/// let ceiling = Ceiling::new(0.9)?;
/// assert_eq!(ceiling.limit_bytes(1000), 900);
/// assert!(Ceiling::new(1.5).is_err() && Ceiling::new(0.0).is_err() && Ceiling::new(f64::NAN).is_err());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Ceiling(f64);

/// 0.90: the tuner's default, room for what a trial does not see (a
/// fragmented pool, another process's context).
impl Default for Ceiling {
    fn default() -> Ceiling {
        Ceiling(0.90)
    }
}

impl TryFrom<f64> for Ceiling {
    type Error = crate::Error;

    fn try_from(fraction: f64) -> Result<Ceiling, crate::Error> {
        Ceiling::new(fraction)
    }
}

impl From<Ceiling> for f64 {
    fn from(ceiling: Ceiling) -> f64 {
        ceiling.0
    }
}

impl Ceiling {
    /// `fraction` as a ceiling, or [`Error::InvalidSetting`](crate::Error::InvalidSetting)
    /// when it is not in (0, 1].
    pub fn new(fraction: f64) -> Result<Ceiling, crate::Error> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Ceiling(fraction))
        } else {
            Err(crate::Error::invalid(
                crate::Setting::Ceiling,
                crate::Value::Fraction(fraction),
                "it must be a fraction in (0, 1]: pass e.g. 0.9 for 90% of device memory",
            ))
        }
    }

    /// The fraction.
    pub fn fraction(self) -> f64 {
        self.0
    }

    /// `ceiling × capacity`, rounded down to whole bytes: a peak `p` is under
    /// the ceiling exactly when `p <= limit_bytes(capacity)`.
    pub fn limit_bytes(self, capacity_bytes: u64) -> u64 {
        (self.0 * capacity_bytes as f64).floor() as u64
    }
}

/// As a percentage: whole where it is whole (`90%`), else to a tenth (`85.5%`).
///
/// ```
/// use autobatch::plan::Ceiling;
/// assert_eq!(Ceiling::new(0.9)?.to_string(), "90%");
/// assert_eq!(Ceiling::new(0.855)?.to_string(), "85.5%");
/// # Ok::<(), autobatch::Error>(())
/// ```
impl std::fmt::Display for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::units::format_percent(self.0))
    }
}

pub(crate) fn utilization(bytes: u64, capacity_bytes: u64) -> f64 {
    if capacity_bytes == 0 { 0.0 } else { bytes as f64 / capacity_bytes as f64 }
}

//! The utilization ceiling and the byte limit it sets.

/// A utilization ceiling: the most a fitting step may use, as a fraction in
/// (0, 1] of a device's capacity. Checked once, turned into bytes one way.
///
/// ```
/// use autobatch::Ceiling;
///
/// let ceiling = Ceiling::new(0.9)?;
/// assert_eq!(ceiling.limit_bytes(1000), 900);
/// assert!(Ceiling::new(1.5).is_err() && Ceiling::new(0.0).is_err() && Ceiling::new(f64::NAN).is_err());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling(f64);

impl Ceiling {
    /// `fraction` as a ceiling, or [`Error::InvalidCeiling`](crate::Error::InvalidCeiling)
    /// when it is not in (0, 1].
    pub fn new(fraction: f64) -> Result<Ceiling, crate::Error> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Ceiling(fraction))
        } else {
            Err(crate::Error::InvalidCeiling { ceiling: fraction })
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

/// `ceiling × capacity`, rounded down to whole bytes, for a ceiling already
/// checked (or read back from a plan).
pub(crate) fn limit_bytes(ceiling: f64, capacity_bytes: u64) -> u64 {
    Ceiling(ceiling).limit_bytes(capacity_bytes)
}

pub(crate) fn utilization(bytes: u64, capacity_bytes: u64) -> f64 {
    if capacity_bytes == 0 {
        0.0
    } else {
        bytes as f64 / capacity_bytes as f64
    }
}

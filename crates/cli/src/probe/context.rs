//! What every mode of a probe command needs: the request its flags were
//! converted into, and the device it runs on. A leaf of the probe's rooms:
//! the modes take it, it knows none of them.

use super::request::Request;
use crate::model::ModelConfig;

/// One probe command on a chosen device: what every mode needs to know.
pub struct Run<'a> {
    pub request: &'a Request,
    pub model: &'a ModelConfig,
    pub device: &'a candle_core::Device,
    /// The device in words, for the header and the chart.
    pub device_words: &'a str,
    /// Where the device's size came from (`--budget`, the default).
    pub size_from: &'a str,
    /// Prints a header line (not in --json).
    pub header: &'a dyn Fn(&str),
}

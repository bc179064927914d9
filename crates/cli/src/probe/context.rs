//! What every mode of a probe command needs: the flags, the tuner, the
//! model and the device they run on. A leaf of the probe's rooms: the modes
//! take it, it knows none of them.

use autobatch::Tuner;

use crate::args::ProbeArgs;
use crate::model::ModelConfig;

/// One probe command on a chosen device: what every mode needs to know.
pub struct Run<'a> {
    pub args: &'a ProbeArgs,
    pub tuner: &'a Tuner,
    pub model: &'a ModelConfig,
    pub device: &'a candle_core::Device,
    /// The device in words, for the header and the chart.
    pub device_words: &'a str,
    /// Where the device's size came from (`--budget`, the default).
    pub size_from: &'a str,
    /// Prints a header line (not in --json).
    pub header: &'a dyn Fn(&str),
}

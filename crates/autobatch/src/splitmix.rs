//! splitmix64: the one small deterministic mixer of the crate (simulated
//! noise). A leaf.

/// The splitmix64 increment (the golden ratio in 64 bits).
pub(crate) const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One splitmix64 output for state `x`: advances by [`GOLDEN_GAMMA`] and mixes.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

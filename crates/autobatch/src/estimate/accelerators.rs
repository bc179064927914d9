//! Accelerators by name, with the memory each reports to software.
//!
//! The capacity is the total the driver reports (`nvidia-smi`'s
//! `memory.total`, `cuMemGetInfo`'s total, `rocm-smi`'s VRAM total): what a
//! meter on that card sees as its capacity, a little under the marketing
//! figure ("80 GB") because the driver reserves part of the memory. Sources,
//! each a printout of the card's reported total:
//!
//! - H100 80GB HBM3 81559 MiB, A100 80GB 81920 MiB, A100 40GB 40960 MiB, A10
//!   23028 MiB, L40S 46068 MiB, L4 23034 MiB, T4 15360 MiB: `nvidia-smi`
//!   totals listed in modal-labs/modal-client#2797 (H100 also in
//!   NVIDIA/nccl#1264, L40S also in akash-network/provider-configs#99).
//! - H100 NVL 99961274368 bytes: fastfetch-cli/fastfetch#1658.
//! - H200 143771 MiB: `nvidia-smi` on H200 SXM (141 GB HBM3e).
//! - RTX 4090 24564 MiB: RLinf/RLinf#255; RTX 3090 24576 MiB:
//!   noonghunna/club-3090#1127.
//! - V100 PCIe 32GB 32480 MiB: an `nvidia-smi` printout of four Tesla
//!   V100-PCIE cards (blog.cachecha.com, "nvidia-smi详解"); V100 SXM2 16GB
//!   16160 MiB: `nvidia-smi` on Tesla V100-SXM2-16GB.
//! - MI300X 206141652992 bytes: `rocm-smi` VRAM total, ROCm/legacy-rocm-build#4750.

use crate::Error;

/// A named accelerator and the memory it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accelerator {
    /// The name to ask for it by, e.g. `h100`.
    pub name: &'static str,
    /// Other names it goes by, e.g. `h100-80gb`.
    pub aliases: &'static [&'static str],
    /// What the card is, e.g. `NVIDIA H100 80GB HBM3 (SXM)`.
    pub description: &'static str,
    /// The total memory the driver reports, in bytes.
    pub memory_bytes: u64,
}

const MIB: u64 = 1 << 20;

impl Accelerator {
    /// Every accelerator known by name, smallest memory first.
    pub const ALL: &'static [Accelerator] = &[
        Accelerator { name: "t4", aliases: &[], description: "NVIDIA T4 16GB", memory_bytes: 15360 * MIB },
        Accelerator {
            name: "v100-16gb",
            aliases: &["v100"],
            description: "NVIDIA Tesla V100 SXM2 16GB",
            memory_bytes: 16160 * MIB,
        },
        Accelerator {
            name: "a10",
            aliases: &["a10g"],
            description: "NVIDIA A10 / A10G 24GB",
            memory_bytes: 23028 * MIB,
        },
        Accelerator { name: "l4", aliases: &[], description: "NVIDIA L4 24GB", memory_bytes: 23034 * MIB },
        Accelerator {
            name: "rtx4090",
            aliases: &[],
            description: "NVIDIA GeForce RTX 4090 24GB",
            memory_bytes: 24564 * MIB,
        },
        Accelerator {
            name: "rtx3090",
            aliases: &[],
            description: "NVIDIA GeForce RTX 3090 24GB",
            memory_bytes: 24576 * MIB,
        },
        Accelerator {
            name: "v100-32gb",
            aliases: &[],
            description: "NVIDIA Tesla V100 32GB",
            memory_bytes: 32480 * MIB,
        },
        Accelerator { name: "a100-40gb", aliases: &[], description: "NVIDIA A100 40GB", memory_bytes: 40960 * MIB },
        Accelerator { name: "l40s", aliases: &[], description: "NVIDIA L40S 48GB", memory_bytes: 46068 * MIB },
        Accelerator {
            name: "h100",
            aliases: &["h100-80gb", "h100-sxm"],
            description: "NVIDIA H100 80GB HBM3 (SXM)",
            memory_bytes: 81559 * MIB,
        },
        Accelerator {
            name: "a100-80gb",
            aliases: &["a100"],
            description: "NVIDIA A100 80GB",
            memory_bytes: 81920 * MIB,
        },
        Accelerator {
            name: "h100-nvl",
            aliases: &[],
            description: "NVIDIA H100 NVL 94GB",
            memory_bytes: 99_961_274_368,
        },
        Accelerator { name: "h200", aliases: &[], description: "NVIDIA H200 141GB HBM3e", memory_bytes: 143771 * MIB },
        Accelerator {
            name: "mi300x",
            aliases: &[],
            description: "AMD Instinct MI300X 192GB",
            memory_bytes: 206_141_652_992,
        },
    ];

    /// The accelerator called `name` (its name or an alias, any case, `_` or `-`).
    ///
    /// ```
    /// use autobatch::estimate::Accelerator;
    ///
    /// assert_eq!(Accelerator::named("H100")?.memory_bytes, 81559 << 20);
    /// assert_eq!(Accelerator::named("a100_80gb")?.name, "a100-80gb");
    /// assert!(Accelerator::named("h1000").is_err());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn named(name: &str) -> Result<&'static Accelerator, Error> {
        let wanted = name.trim().to_ascii_lowercase().replace('_', "-");
        let found = Accelerator::ALL.iter().find(|card| card.name == wanted || card.aliases.contains(&wanted.as_str()));
        found.ok_or_else(|| {
            let suggestion = match Accelerator::nearest(&wanted) {
                Some(card) => format!("did you mean {} ({})? ", card.name, card.description),
                None => String::new(),
            };
            Error::invalid(
                crate::Setting::Accelerator,
                crate::Value::Text(name.to_owned()),
                format!("{suggestion}known names are {} (or give its memory, e.g. 80GB)", known_names()),
            )
        })
    }

    /// The card a near miss of its name means: `rtx409`, `h-100`, `a100`
    /// (the first of its sizes), or a card's number alone (`4090`).
    pub fn nearest(text: &str) -> Option<&'static Accelerator> {
        let wanted: String = text.trim().to_ascii_lowercase().chars().filter(char::is_ascii_alphanumeric).collect();
        if wanted.is_empty() {
            return None;
        }
        let squeezed = |name: &str| name.chars().filter(char::is_ascii_alphanumeric).collect::<String>();
        let names = |card: &'static Accelerator| std::iter::once(card.name).chain(card.aliases.iter().copied());
        let all = || Accelerator::ALL.iter().flat_map(move |card| names(card).map(move |name| (card, squeezed(name))));
        // a name that starts with or ends with what was given (`a100` → a100-40gb, `4090` → rtx4090)
        if wanted.len() >= 2
            && let Some((card, _)) = all().find(|(_, name)| name.starts_with(&wanted) || name.ends_with(&wanted))
        {
            return Some(card);
        }
        // one letter off
        all().filter(|(_, name)| edit_distance(name, &wanted) <= 1).map(|(card, _)| card).next()
    }
}

/// Levenshtein distance of two short names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            previous = current;
        }
    }
    row[b.len()]
}

/// The names [`Accelerator::named`] knows, comma-separated.
pub(crate) fn known_names() -> String {
    Accelerator::ALL.iter().map(|card| card.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_miss_or_a_cards_number_names_the_card() {
        for (given, card) in
            [("4090", "rtx4090"), ("rtx409", "rtx4090"), ("h-100", "h100"), ("a100-40", "a100-40gb"), ("h20", "h200")]
        {
            assert_eq!(Accelerator::nearest(given).map(|c| c.name), Some(card), "{given}");
        }
        assert_eq!(Accelerator::nearest("zz"), None);
        let err = Accelerator::named("rtx409").unwrap_err().to_string();
        assert!(err.contains("did you mean rtx4090"), "{err}");
    }

    #[test]
    fn names_and_aliases_are_unique_and_in_memory_order() {
        let mut names: Vec<&str> =
            Accelerator::ALL.iter().flat_map(|c| std::iter::once(c.name).chain(c.aliases.iter().copied())).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        assert!(Accelerator::ALL.windows(2).all(|pair| pair[0].memory_bytes <= pair[1].memory_bytes));
        for card in Accelerator::ALL {
            assert_eq!(Accelerator::named(card.name).unwrap(), card);
            for alias in card.aliases {
                assert_eq!(Accelerator::named(alias).unwrap(), card);
            }
        }
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let err = Accelerator::named("h1000").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("h1000") && text.contains("h100, ") && text.contains("mi300x"), "{text}");
        assert!(err.is_configuration());
    }

    #[test]
    fn reported_memory_is_at_most_the_size_on_the_box_in_gib() {
        // "80GB" is 80 GiB of memory, of which the driver keeps a little
        for (name, gib) in [("h100", 80), ("a100-80gb", 80), ("h200", 141), ("l4", 24), ("mi300x", 192)] {
            let reported = Accelerator::named(name).unwrap().memory_bytes;
            assert!(reported <= gib << 30 && reported >= (gib - 2) << 30, "{name} {reported}");
        }
    }
}

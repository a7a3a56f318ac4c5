//! The config enums the command lines take as flag values (`--durability`,
//! `--tier` of the server and of loadgen): one definition, the names of the
//! config file, and one help line per value. Built with the `clap` feature
//! only, so the config crate does not pull clap into the engine.

use crate::{Durability, Tier};
use clap::builder::PossibleValue;
use clap::ValueEnum;

impl ValueEnum for Durability {
    fn value_variants<'a>() -> &'a [Self] {
        &[Durability::Sync, Durability::Async, Durability::None]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Durability::Sync => "Acknowledge a write after the fdatasync that covers it",
            Durability::Async => {
                "Acknowledge once applied in memory; flush periodically in the background"
            }
            Durability::None => "RAM only, no write-ahead log",
        };
        Some(PossibleValue::new(self.as_str()).help(help))
    }
}

impl ValueEnum for Tier {
    fn value_variants<'a>() -> &'a [Self] {
        &[Tier::Memory, Tier::Hybrid]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Tier::Memory => "Every key and value in RAM (persisted through the WAL and snapshots)",
            Tier::Hybrid => {
                "Index in RAM, values in segment files on the value device \
                 (storage.value_device), hot values cached; needs a WAL, so not with \
                 durability none"
            }
        };
        Some(PossibleValue::new(self.as_str()).help(help))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NamedVariants;

    /// A flag takes exactly the names the config file takes.
    #[test]
    fn flag_values_are_the_config_names() {
        for d in Durability::value_variants() {
            let v = d.to_possible_value().expect("every variant is a value");
            assert_eq!(v.get_name(), d.as_str());
            assert_eq!(
                <Durability as ValueEnum>::from_str(d.as_str(), false),
                Ok(*d)
            );
        }
        for t in Tier::value_variants() {
            let v = t.to_possible_value().expect("every variant is a value");
            assert_eq!(v.get_name(), t.as_str());
            assert_eq!(<Tier as ValueEnum>::from_str(t.as_str(), false), Ok(*t));
        }
        assert_eq!(Durability::value_variants().len(), Durability::NAMES.len());
        assert_eq!(Tier::value_variants().len(), Tier::NAMES.len());
    }
}

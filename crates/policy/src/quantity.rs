//! Kubernetes resource quantities (`500m`, `4`, `256Mi`, `1G`) as exact integers.
//!
//! Claims carry consumed capacity and devices publish capacities as quantities. The policy needs
//! them as numbers it can add and compare exactly, so a [`Quantity`] stores thousandths of the
//! unit (milli-CPUs for `cpu`, milli-bytes for memory: 1 TiB is about 1.1e15, far inside `u64`).
//! Negative quantities never occur in what we read or publish and are refused.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative quantity, exact to a thousandth of its unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    milli: u64,
}

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityParseError {
    /// The whole input.
    pub input: String,
    /// What was wrong with it.
    pub reason: &'static str,
}

impl Quantity {
    /// A quantity of whole units (CPUs, bytes).
    pub const fn from_units(units: u64) -> Self {
        Self {
            milli: units.saturating_mul(1000),
        }
    }

    /// A quantity in thousandths of a unit.
    pub const fn from_milli(milli: u64) -> Self {
        Self { milli }
    }

    /// Thousandths of a unit.
    pub const fn milli(self) -> u64 {
        self.milli
    }

    /// Whole units, rounded up: a claim that consumed `1500m` CPUs needs 2 exclusive CPUs.
    pub const fn units_ceil(self) -> u64 {
        self.milli.div_ceil(1000)
    }
}

impl FromStr for Quantity {
    type Err = QuantityParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| QuantityParseError {
            input: input.to_owned(),
            reason,
        };
        let s = input.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(split);
        if number.is_empty() {
            return Err(err("no number"));
        }
        // (multiplier numerator, denominator) applied to the number, in milli-units.
        let (num, den): (u128, u128) = match suffix {
            "m" => (1, 1),
            "" => (1000, 1),
            "k" => (1000 * 1000, 1),
            "M" => (1000 * 1_000_000, 1),
            "G" => (1000 * 1_000_000_000, 1),
            "T" => (1000 * 1_000_000_000_000, 1),
            "Ki" => (1000 << 10, 1),
            "Mi" => (1000 << 20, 1),
            "Gi" => (1000 << 30, 1),
            "Ti" => (1000 << 40, 1),
            "Pi" => (1000 << 50, 1),
            "u" => (1, 1000),
            "n" => (1, 1_000_000),
            _ => return Err(err("unknown suffix")),
        };
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(err("malformed number"));
        }
        if int.len() + frac.len() > 30 {
            return Err(err("too many digits"));
        }
        let digits: u128 = format!("{int}{frac}")
            .parse()
            .map_err(|_| err("malformed number"))?;
        let scale = 10u128.pow(u32::try_from(frac.len()).map_err(|_| err("too many digits"))?);
        // Round up: Kubernetes rounds quantities up to the precision it can represent, and a
        // capacity rounded down could let a claim take more than it was given.
        let milli = (digits * num).div_ceil(scale * den);
        u64::try_from(milli)
            .map(Self::from_milli)
            .map_err(|_| err("too large"))
    }
}

/// Prints in whole units when exact (`4`), else in milli-units (`1500m`): both forms parse back,
/// and the Kubernetes API accepts both.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli.is_multiple_of(1000) {
            write!(f, "{}", self.milli / 1000)
        } else {
            write!(f, "{}m", self.milli)
        }
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> u64 {
        s.parse::<Quantity>().unwrap().milli()
    }

    #[test]
    fn parses_cpu_and_memory_quantities() {
        assert_eq!(q("500m"), 500);
        assert_eq!(q("4"), 4000);
        assert_eq!(q("1.5"), 1500);
        assert_eq!(q("0.1"), 100);
        assert_eq!(q("256Mi"), 256 * 1024 * 1024 * 1000);
        assert_eq!(q("1G"), 1_000_000_000_000);
        assert_eq!(q("2k"), 2_000_000);
        assert_eq!(q("1500000u"), 1500);
    }

    #[test]
    fn rounds_sub_milli_amounts_up() {
        assert_eq!(q("1n"), 1);
        assert_eq!(q("0.0001"), 1);
        assert_eq!(Quantity::from_milli(1001).units_ceil(), 2);
        assert_eq!(Quantity::from_milli(1000).units_ceil(), 1);
    }

    #[test]
    fn refuses_what_is_not_a_quantity() {
        for (input, reason) in [
            ("", "no number"),
            ("m", "no number"),
            ("-1", "no number"),
            ("1x", "unknown suffix"),
            ("1.2.3", "malformed number"),
            (".", "malformed number"),
            ("99999999999999999999Pi", "too large"),
            ("1234567890123456789012345678901", "too many digits"),
        ] {
            let err = input.parse::<Quantity>().unwrap_err();
            assert_eq!(err.reason, reason, "{input:?}");
        }
    }

    #[test]
    fn prints_in_a_form_that_parses_back() {
        for milli in [0, 1, 999, 1000, 1500, 4000, 123_456_789] {
            let x = Quantity::from_milli(milli);
            assert_eq!(x.to_string().parse::<Quantity>().unwrap(), x);
        }
        assert_eq!(Quantity::from_units(4).to_string(), "4");
        assert_eq!(Quantity::from_milli(1500).to_string(), "1500m");
    }
}

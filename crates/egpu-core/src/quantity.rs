//! Human quantities: byte sizes with binary and decimal units, and percentages.
//!
//! `Bytes` accepts `1024`, `512MiB`, `8GiB`, `1.5GB`, `80G` (a bare `G`/`M`/`K`
//! is binary, as in Kubernetes' `Gi` and most GPU tooling), case-insensitive.
//! `Percent` is kept in basis points (hundredths of a percent) so that shares
//! add up exactly.

use std::fmt;
use std::str::FromStr;

/// Why a quantity could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity: give a size such as 8GiB or 512MiB")]
    Empty,
    #[error("'{input}' is not a size: expected a number followed by an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 8GiB")]
    BadSize { input: String },
    #[error("'{input}' has unknown unit '{unit}': use one of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB")]
    BadUnit { input: String, unit: String },
    #[error("'{input}' is too large: sizes must fit in 64 bits of bytes")]
    Overflow { input: String },
    #[error("'{input}' is not a percentage: expected a number from 0 to 100, optionally followed by %, e.g. 30%")]
    BadPercent { input: String },
    #[error("'{input}' is out of range: a percentage must be between 0% and 100%")]
    PercentRange { input: String },
    #[error("'{input}' is finer than 0.01%: give at most two decimals, e.g. 12.34%")]
    PercentPrecision { input: String },
    #[error("'{input}' is not a whole number of bytes: a byte count has no decimals (1.5KiB and 1536 are both fine)")]
    Fraction { input: String },
}

/// A number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    pub const KIB: u64 = 1 << 10;
    pub const MIB: u64 = 1 << 20;
    pub const GIB: u64 = 1 << 30;
    pub const TIB: u64 = 1 << 40;

    pub fn gib(n: u64) -> Bytes {
        Bytes(n * Self::GIB)
    }
    pub fn mib(n: u64) -> Bytes {
        Bytes(n * Self::MIB)
    }
}

fn unit_factor(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

impl FromStr for Bytes {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim();
        if input.is_empty() {
            return Err(QuantityError::Empty);
        }
        let split = input
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(input.len());
        let (num, unit) = input.split_at(split);
        let unit = unit.trim();
        let bad = || QuantityError::BadSize { input: input.to_string() };
        if num.is_empty() || num.matches('.').count() > 1 || num.starts_with('.') || num.ends_with('.') {
            return Err(bad());
        }
        let factor = unit_factor(unit).ok_or_else(|| QuantityError::BadUnit {
            input: input.to_string(),
            unit: unit.to_string(),
        })?;
        let overflow = || QuantityError::Overflow { input: input.to_string() };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        let int: u64 = int.parse().map_err(|_| overflow())?;
        let mut total = int.checked_mul(factor).ok_or_else(overflow)?;
        if !frac.is_empty() {
            // Exact decimal fraction: frac_digits / 10^len * factor, rounded down.
            if frac.len() > 18 {
                return Err(bad());
            }
            let digits: u128 = frac.parse().map_err(|_| bad())?;
            let scale = 10u128.pow(frac.len() as u32);
            // A fraction of a larger unit is rounded down to a whole byte
            // (what Display prints must parse back); a fraction of a byte
            // itself is a mistake.
            if factor == 1 && digits != 0 {
                return Err(QuantityError::Fraction { input: input.to_string() });
            }
            let part = digits * factor as u128 / scale;
            total = total.checked_add(part as u64).ok_or_else(overflow)?;
        }
        Ok(Bytes(total))
    }
}

impl fmt::Display for Bytes {
    /// Prints the largest binary unit that holds the value exactly in at
    /// most one decimal (`8GiB`, `1.5GiB`, `300B`), looking down to MiB
    /// (`16389MiB`, `1280MiB`: a limit typed in MiB reads back as typed,
    /// and two sizes a few MiB apart do not print alike), or else the
    /// largest unit rounded down to two decimals, always both shown: two
    /// decimals mean rounded (`16.00GiB` is a little over 16GiB, never
    /// exactly it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let units = [("TiB", Self::TIB), ("GiB", Self::GIB), ("MiB", Self::MIB), ("KiB", Self::KIB)];
        let Some(largest) = units.iter().position(|u| v >= u.1) else {
            return write!(f, "{v}B");
        };
        let exact = |factor: u64| (v as u128 * 10).is_multiple_of(factor as u128);
        // The largest unit that is exact, looking down to MiB (KiB only for
        // a value under a MiB); else the largest, rounded.
        let (unit, factor) = units[largest..].iter().take_while(|u| u.1 >= Self::MIB || largest == 3).find(|u| exact(u.1)).copied().unwrap_or(units[largest]);
        let hundredths = (v as u128 * 100 / factor as u128) as u64;
        let (whole, frac) = (hundredths / 100, hundredths % 100);
        if !exact(factor) {
            write!(f, "{whole}.{frac:02}{unit}")
        } else if frac == 0 {
            write!(f, "{whole}{unit}")
        } else {
            write!(f, "{whole}.{}{unit}", frac / 10)
        }
    }
}

/// A percentage in basis points: `Percent(3000)` is 30%.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Percent(pub u32);

impl Percent {
    pub const FULL: Percent = Percent(10_000);
    pub const ZERO: Percent = Percent(0);

    pub fn from_pct(pct: u32) -> Percent {
        Percent(pct * 100)
    }
    pub fn basis_points(self) -> u32 {
        self.0
    }
    pub fn as_fraction(self) -> f64 {
        self.0 as f64 / 10_000.0
    }
}

impl FromStr for Percent {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim();
        let num = input.strip_suffix('%').unwrap_or(input).trim();
        let bad = || QuantityError::BadPercent { input: input.to_string() };
        if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') || num.matches('.').count() > 1 {
            return Err(bad());
        }
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() {
            return Err(bad());
        }
        let range = || QuantityError::PercentRange { input: input.to_string() };
        let int: u32 = int.parse().map_err(|_| range())?;
        if frac.len() > 2 && frac[2..].chars().any(|c| c != '0') {
            // 100.0001% is out of range before it is too fine.
            return Err(if int >= 100 { range() } else { QuantityError::PercentPrecision { input: input.to_string() } });
        }
        let frac2 = format!("{:0<2}", &frac[..frac.len().min(2)]);
        let frac: u32 = frac2.parse().map_err(|_| bad())?;
        let bps = int.checked_mul(100).and_then(|v| v.checked_add(frac));
        match bps {
            Some(b) if b <= 10_000 => Ok(Percent(b)),
            _ => Err(QuantityError::PercentRange { input: input.to_string() }),
        }
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 100, self.0 % 100);
        if frac == 0 {
            write!(f, "{whole}%")
        } else if frac % 10 == 0 {
            write!(f, "{whole}.{}%", frac / 10)
        } else {
            write!(f, "{whole}.{frac:02}%")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        assert_eq!("1024".parse::<Bytes>().unwrap(), Bytes(1024));
        assert_eq!("8GiB".parse::<Bytes>().unwrap(), Bytes(8 << 30));
        assert_eq!("8gib".parse::<Bytes>().unwrap(), Bytes(8 << 30));
        assert_eq!("1.5GiB".parse::<Bytes>().unwrap(), Bytes(3 << 29));
        assert_eq!("2GB".parse::<Bytes>().unwrap(), Bytes(2_000_000_000));
        assert_eq!("80G".parse::<Bytes>().unwrap(), Bytes(80 << 30));
        assert_eq!("512 MiB".parse::<Bytes>().unwrap(), Bytes(512 << 20));
    }

    #[test]
    fn rejects_bad_sizes_with_reason() {
        assert_eq!("".parse::<Bytes>(), Err(QuantityError::Empty));
        assert!(matches!("abc".parse::<Bytes>(), Err(QuantityError::BadSize { .. })));
        assert!(matches!("-1GiB".parse::<Bytes>(), Err(QuantityError::BadSize { .. })));
        assert!(matches!("1.2.3GiB".parse::<Bytes>(), Err(QuantityError::BadSize { .. })));
        assert!(matches!("8XB".parse::<Bytes>(), Err(QuantityError::BadUnit { .. })));
        assert!(matches!("99999999999TiB".parse::<Bytes>(), Err(QuantityError::Overflow { .. })));
        assert!(matches!("1.5B".parse::<Bytes>(), Err(QuantityError::Fraction { .. })));
        assert!(matches!("1.5".parse::<Bytes>(), Err(QuantityError::Fraction { .. })));
        assert_eq!("1.0B".parse::<Bytes>(), Ok(Bytes(1)));
        assert_eq!("1.5KiB".parse::<Bytes>(), Ok(Bytes(1536)));
        let msg = "8XB".parse::<Bytes>().unwrap_err().to_string();
        assert!(msg.contains("GiB"), "error should say which units exist: {msg}");
    }

    #[test]
    fn percentages() {
        assert_eq!("30%".parse::<Percent>().unwrap(), Percent(3000));
        assert_eq!("30".parse::<Percent>().unwrap(), Percent(3000));
        assert_eq!("12.5%".parse::<Percent>().unwrap(), Percent(1250));
        assert_eq!("100%".parse::<Percent>().unwrap(), Percent::FULL);
        assert!(matches!("101%".parse::<Percent>(), Err(QuantityError::PercentRange { .. })));
        assert!(matches!("-5%".parse::<Percent>(), Err(QuantityError::BadPercent { .. })));
        assert!(matches!("%".parse::<Percent>(), Err(QuantityError::BadPercent { .. })));
        assert!(matches!("12.345%".parse::<Percent>(), Err(QuantityError::PercentPrecision { .. })));
        assert!(matches!("100.0001%".parse::<Percent>(), Err(QuantityError::PercentRange { .. })));
        assert_eq!("12.340%".parse::<Percent>(), Ok(Percent(1234)));
        assert_eq!(Percent(1250).to_string(), "12.5%");
        assert_eq!(Percent(3000).to_string(), "30%");
    }

    #[test]
    fn display() {
        assert_eq!(Bytes(8 << 30).to_string(), "8GiB");
        assert_eq!(Bytes(3 << 29).to_string(), "1.5GiB");
        assert_eq!(Bytes(300).to_string(), "300B");
        assert_eq!(Bytes((16 << 30) + (5 << 20)).to_string(), "16389MiB", "a few MiB over 16GiB is not 16GiB");
        assert_eq!(Bytes((16 << 30) + 5).to_string(), "16.00GiB", "not exact: both decimals");
        assert_eq!(Bytes((3 << 29) + (1 << 19)).to_string(), "1536.5MiB");
        assert_eq!(Bytes(1024 * 1024 + 512).to_string(), "1.00MiB");
        assert_eq!(Bytes((1 << 40) + (1 << 30)).to_string(), "1025GiB");
        // An exact quarter is printed exactly, not like a rounded value.
        assert_eq!(Bytes(5 << 28).to_string(), "1280MiB");
        assert_eq!(Bytes((5 << 28) + 5).to_string(), "1.25GiB");
    }

    proptest! {
        #[test]
        fn display_roundtrips_exact_units(n in 0u64..1_000_000, shift in prop::sample::select(vec![0u32, 10, 20, 30])) {
            let b = Bytes(n << shift);
            let parsed: Bytes = b.to_string().parse().unwrap();
            // Whole MiB (and bytes under a KiB) always print exactly.
            if shift >= 20 || b.0 < Bytes::KIB {
                prop_assert_eq!(parsed, b);
            }
            prop_assert!(parsed.0 <= b.0 && b.0 - parsed.0 < b.0 / 100 + 1);
        }

        #[test]
        fn display_says_exact_only_when_it_is(v in 0u64..(1 << 44)) {
            let text = Bytes(v).to_string();
            let parsed: Bytes = text.parse().unwrap();
            prop_assert!(parsed.0 <= v && v - parsed.0 < v / 100 + 1, "{text}");
            // Two decimals shown exactly when the value is rounded: an
            // exact size never prints like a rounded one.
            let decimals = text.split('.').nth(1).map_or(0, |d| d.bytes().take_while(u8::is_ascii_digit).count());
            prop_assert_eq!(decimals == 2, parsed.0 != v, "{}", text);
        }

        #[test]
        fn never_panics_on_arbitrary_input(s in ".{0,40}") {
            let _ = s.parse::<Bytes>();
            let _ = s.parse::<Percent>();
        }

        #[test]
        fn percent_roundtrip(bps in 0u32..=10_000) {
            let p = Percent(bps);
            prop_assert_eq!(p.to_string().parse::<Percent>().unwrap(), p);
        }
    }
}

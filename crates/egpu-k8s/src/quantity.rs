//! Kubernetes quantities (`resource.Quantity`, as the API server writes them
//! in a ResourceClaim's `consumedCapacity`), read exactly.
//!
//! A quantity is a decimal number with an optional binary suffix (`Ki` …
//! `Ei`), decimal suffix (`n`, `u`, `m`, `k`, `M` … `E`) or exponent
//! (`e3`, `E-2`). `egpu_core::quantity` reads eGPU's own spellings (`GiB`);
//! this reads the API's. Hand-written: the published crates for it parse to
//! floating point, and a byte count must be exact. Pure code.

/// Why a quantity cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("'{0}' is not a Kubernetes quantity (a number with an optional suffix such as Gi, M, m or e9)")]
    Syntax(String),
    #[error("'{0}' is negative")]
    Negative(String),
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// The quantity `s` times `factor`, rounded up to a whole number (the API
/// server rounds a consumed amount up too).
pub fn ceil_times(s: &str, factor: u64) -> Result<u64, QuantityError> {
    let syntax = || QuantityError::Syntax(s.to_string());
    let t = s.trim();
    let (sign, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(syntax());
    }
    // (power of 2, power of 10) of the suffix.
    let (p2, p10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| syntax())?;
            // Beyond these a value is too large for u64, or (if not zero)
            // under one, which rounds up to one below.
            (0, exp.clamp(-100, 100))
        }
        _ => return Err(syntax()),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    // Zeros ending the fraction change nothing.
    let frac = frac.trim_end_matches('0');
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let zero = digits.is_empty();
    if sign && !zero {
        return Err(QuantityError::Negative(s.to_string()));
    }
    if zero {
        return Ok(0);
    }
    if digits.len() > 30 {
        return Err(QuantityError::TooLarge(s.to_string()));
    }
    let too_large = || QuantityError::TooLarge(s.to_string());
    // value = digits × 10^(p10 − frac.len()) × 2^p2, times factor.
    let mantissa: u128 = digits.parse().map_err(|_| syntax())?;
    let scaled = mantissa.checked_mul(u128::from(factor)).and_then(|m| m.checked_shl(p2).filter(|v| v >> p2 == m)).ok_or_else(too_large)?;
    let exp10 = p10 - i32::try_from(frac.len()).map_err(|_| too_large())?;
    let value = if exp10 >= 0 {
        10u128.checked_pow(exp10.unsigned_abs()).and_then(|p| scaled.checked_mul(p)).ok_or_else(too_large)?
    } else {
        match 10u128.checked_pow(exp10.unsigned_abs()) {
            Some(p) => scaled.div_ceil(p),
            // Divided by more than u128 holds: a positive value under one.
            None => 1,
        }
    };
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_spellings_the_api_server_writes() {
        assert_eq!(ceil_times("10Gi", 1), Ok(10 << 30));
        assert_eq!(ceil_times("17179869184", 1), Ok(16 << 30));
        assert_eq!(ceil_times("1.5Gi", 1), Ok(3 << 29));
        assert_eq!(ceil_times("16G", 1), Ok(16_000_000_000));
        assert_eq!(ceil_times("2e9", 1), Ok(2_000_000_000));
        assert_eq!(ceil_times("30", 100), Ok(3000), "30 (percent) in basis points");
        assert_eq!(ceil_times("12.5", 100), Ok(1250));
        assert_eq!(ceil_times("500m", 100), Ok(50), "half a percent");
        assert_eq!(ceil_times("1m", 1), Ok(1), "rounded up");
        assert_eq!(ceil_times("0", 1), Ok(0));
        assert_eq!(ceil_times("-0", 1), Ok(0));
        assert_eq!(ceil_times("1E-50", 1), Ok(1), "a tiny amount rounds up to one");
        assert_eq!(ceil_times("1e-100000", 1), Ok(1));
        assert_eq!(ceil_times(&format!("1.{}", "0".repeat(40)), 1), Ok(1), "zeros ending the fraction");
        assert!(matches!(ceil_times("1e100000", 1), Err(QuantityError::TooLarge(_))));
        assert!(matches!(ceil_times("-1Gi", 1), Err(QuantityError::Negative(_))));
        assert!(matches!(ceil_times("10GiB", 1), Err(QuantityError::Syntax(_))));
        assert!(matches!(ceil_times("ten", 1), Err(QuantityError::Syntax(_))));
        assert!(matches!(ceil_times("", 1), Err(QuantityError::Syntax(_))));
        assert!(matches!(ceil_times("1.2.3", 1), Err(QuantityError::Syntax(_))));
        assert!(matches!(ceil_times("16Ei", 1), Err(QuantityError::TooLarge(_))));
        assert!(matches!(ceil_times("99999999999999999999999999999999", 1), Err(QuantityError::TooLarge(_))));
    }

    proptest! {
        #[test]
        fn never_panics_and_round_trips_whole_numbers(s in "[-+]?[0-9.]{0,40}(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|e-?[0-9]{1,3})?", n in any::<u64>(), f in 1u64..=10_000) {
            let _ = ceil_times(&s, f);
            prop_assert_eq!(ceil_times(&n.to_string(), 1), Ok(n));
            let kib = n >> 10;
            prop_assert_eq!(ceil_times(&format!("{kib}Ki"), 1), Ok(kib << 10));
            // A decimal number times a factor, rounded up, is never below the exact value.
            let milli = n % 1_000_000;
            prop_assert_eq!(ceil_times(&format!("{milli}m"), f), Ok((u128::from(milli) * u128::from(f)).div_ceil(1000) as u64));
        }
    }
}

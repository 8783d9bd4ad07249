//! Parsing of the size and duration values that flags and config files accept:
//! sizes like `1GiB`, `512MiB`, `20GB`, `4096` (bytes); durations like `2s`, `500ms`, `1m`,
//! `1h`, `250us`.

use std::time::Duration;

/// Parses a byte size. Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones
/// (KB, MB, GB, TB) powers of 1000; `K`/`M`/`G`/`T` alone are binary. Case-insensitive.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    if num.is_empty() {
        return Err(format!(
            "size {s:?}: expected a number with an optional unit, like 1GiB"
        ));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "size {s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    let value = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| format!("size {s:?}: bad number"))?;
        let v = f * mult as f64;
        if !(0.0..1.8e19).contains(&v) {
            return Err(format!("size {s:?} is out of range"));
        }
        v as u64
    } else {
        let n: u64 = num.parse().map_err(|_| format!("size {s:?}: bad number"))?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("size {s:?} is out of range"))?
    };
    Ok(value)
}

/// Parses a duration: a number followed by `us`, `ms`, `s`, `m` or `h` (a bare number is
/// milliseconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "duration {s:?}: expected a number with a unit, like 2s or 500ms"
        ));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: bad number"))?;
    let secs = match unit.trim() {
        "us" | "µs" => n / 1e6,
        "" | "ms" => n / 1e3,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "duration {s:?}: unknown unit {other:?} (use us, ms, s, m, h)"
            ))
        }
    };
    if !(0.0..1e10).contains(&secs) {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats bytes for humans (binary units).
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("20gib").unwrap(), 20 << 30);
        assert_eq!(parse_size("21474836480").unwrap(), 21474836480);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        assert_eq!(format_size(1 << 30), "1.0 GiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("250").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}

//! Command-line quantities: durations (`30s`, `2m`, `500ms`, `1h30m`) and
//! byte sizes (`64`, `4k`, `1MiB`).

use std::time::Duration;

/// Parses `500ms`, `30s`, `2m`, `1h`, `1h30m`, `1.5s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let err = || format!("invalid duration '{s}': expected e.g. 500ms, 30s, 2m, 1h30m");
    if text.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| err());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        rest = &rest[unit_end..];
        total += Duration::try_from_secs_f64(value * scale).map_err(|_| err())?;
    }
    Ok(total)
}

/// Parses a byte count: `64`, `4k`/`4KiB` (1024), `1M`/`1MiB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let err = || format!("invalid size '{s}': expected e.g. 64, 4k, 1MiB");
    let lower = text.to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix('k'))
    {
        (n.to_owned(), 1024)
    } else if let Some(n) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix('m'))
    {
        (n.to_owned(), 1024 * 1024)
    } else {
        (lower.strip_suffix('b').unwrap_or(&lower).to_owned(), 1)
    };
    let n: usize = num.trim().parse().map_err(|_| err())?;
    n.checked_mul(mult).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "10x", "-5s", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("100B"), Ok(100));
        assert!(parse_size("lots").is_err());
    }
}

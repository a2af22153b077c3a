//! The one grammar for quantities on every command line: durations
//! (`1h30m`, `1.5s`, `250ms`, a bare number of seconds), byte sizes (`64`,
//! `64k`, `64KiB`, `1GiB`; a `k` is 1024 bytes), rates (`5k/s`, `60/m`,
//! a ramp `100/s..5000/s`, or stages `0/s..1k/s@30s,1k/s@5m`), counts (`10k` connections: a `k` is 1000)
//! and fractions (`0.1%`, `0.001`), with the formatters that print them
//! back in the same words.
//!
//! `serve`, `hold`, `attack`, `report` and `bench` each had a parser of
//! their own, and what one took the other refused (`serve --ping-interval
//! 1h30m`, `hold --max-message 1GiB`). Every form any of them took is still
//! taken (the tests below list them).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest duration taken: a run, a timeout or an interval past a
/// century is a typo, and a deadline that far out would overflow a clock.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A quantity that does not parse, with examples of what does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

/// Parses a duration: one or more `<number><unit>` (`1h30m`, `1.5s`,
/// `250ms`, `2m30s`), units `ns`, `us`/`µs`, `ms`, `s`, `m`/`min`, `h`; or
/// a bare number of seconds (`30`, `1.5`).
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let bad = || {
        UnitError(format!(
            "invalid duration '{text}' (not a duration: write e.g. 250ms, 30s, 1.5s, 2m or 1h30m)"
        ))
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let secs = match t.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|_| bad())?,
        Err(_) => compound(t).ok_or_else(bad)?,
    };
    if secs > MAX_DURATION {
        return Err(UnitError(format!(
            "duration '{text}' is over a century; give a shorter one"
        )));
    }
    Ok(secs)
}

/// `1h30m`: a run of `<number><unit>` parts, summed.
fn compound(mut rest: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let value: f64 = rest[..num_end].parse().ok()?;
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
            _ => return None,
        };
        rest = &rest[unit_end..];
        total = total.checked_add(Duration::try_from_secs_f64(value * scale).ok()?)?;
    }
    Some(total)
}

/// Parses a byte size: a whole number with an optional unit, case
/// insensitive: `b`, `k`/`kb`/`kib` (1024), `m`/`mb`/`mib`, `g`/`gb`/`gib`,
/// `t`/`tb`/`tib`; `64`, `64k`, `64 KiB`, `1GiB`.
pub fn parse_size(text: &str) -> Result<usize, UnitError> {
    let bad = || {
        UnitError(format!(
            "invalid size '{text}' (not a size: write e.g. 64, 4k, 64KiB, 1MiB or 1GiB)"
        ))
    };
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num.parse().map_err(|_| bad())?;
    let shift: u32 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    value
        .checked_mul(1 << shift)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(bad)
}

/// Parses one rate, events per second: `500/s`, `2k/s`, `1.5k`, `60/m`,
/// `60/min`, `3600/h`, `1/ms`, `1M/s`, or a bare number (per second).
pub fn parse_rate(text: &str) -> Result<f64, UnitError> {
    let rate = one_rate(text).ok_or_else(|| {
        UnitError(format!(
            "invalid rate '{}': expected e.g. '1000/s', '2k/s', '60/m' or a ramp '100/s..5000/s'",
            text.trim()
        ))
    })?;
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(UnitError(format!(
            "rate must be a positive finite number of events per second, not {rate} ('{}')",
            text.trim()
        )))
    }
}

fn one_rate(text: &str) -> Option<f64> {
    let (num, per) = match text.trim().split_once('/') {
        Some((n, unit)) => {
            let per = match unit.trim() {
                "s" | "sec" => 1.0,
                "m" | "min" => 60.0,
                "h" => 3600.0,
                "ms" => 0.001,
                _ => return None,
            };
            (n.trim(), per)
        }
        None => (text.trim(), 1.0),
    };
    let (num, mult) = match num.strip_suffix(['k', 'K']) {
        Some(n) => (n, 1e3),
        None => match num.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (num, 1.0),
        },
    };
    let v: f64 = num.parse().ok()?;
    Some(v * mult / per)
}

/// Parses a count of things (connections, messages): a whole number with an
/// optional `k` (thousand) or `M` (million): `1000`, `10k`, `1.5k`, `1M`.
/// Unlike a size, a `k` here is 1000: these are people's counts, not bytes.
pub fn parse_count(text: &str) -> Result<u64, UnitError> {
    let bad = || {
        UnitError(format!(
            "invalid count '{}' (write a whole number such as 1000, 10k or 1M)",
            text.trim()
        ))
    };
    let t = text.trim();
    let (num, mult) = match t.strip_suffix(['k', 'K']) {
        Some(n) => (n, 1e3),
        None => match t.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (t, 1.0),
        },
    };
    let value: f64 = num.parse().map_err(|_| bad())?;
    let n = value * mult;
    // Whole, positive or zero, and exact in an f64 (far above any count a run holds).
    if !(n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n < 9e15) {
        return Err(bad());
    }
    Ok(n as u64)
}

/// Parses a fraction: a percentage (`0.1%`, `5%`) or a plain number between
/// 0 and 1 (`0.001`). An error rate is written either way.
pub fn parse_fraction(text: &str) -> Result<f64, UnitError> {
    let t = text.trim();
    let bad = || {
        UnitError(format!(
            "invalid fraction '{t}' (write a percentage such as 0.1% or a number between 0 and 1 such as 0.001)"
        ))
    };
    let value = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => t.parse::<f64>().map_err(|_| bad())?,
    };
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(bad())
    }
}

/// A rate as given on the command line: constant (`2k/s`), a linear ramp
/// (`100/s..5000/s`), or stages (`0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s`),
/// events per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum RateSpec {
    /// A constant number of events per second.
    Constant(f64),
    /// A linear ramp from the first to the second rate (events per second).
    Ramp(f64, f64),
    /// One stage after another, each a constant rate or a linear ramp for
    /// its own time (k6's stages): ramp up, hold at the peak, ramp down.
    Stages(Stages),
}

impl RateSpec {
    /// The highest rate the spec reaches, events per second.
    pub fn peak(&self) -> f64 {
        match self {
            Self::Constant(r) => *r,
            Self::Ramp(a, b) => a.max(*b),
            Self::Stages(s) => s
                .stages()
                .iter()
                .map(|st| st.from.max(st.to))
                .fold(0.0, f64::max),
        }
    }
}

/// Most stages a rate may have: they are kept inline, so that a rate stays
/// `Copy` and small (a ramp up, a hold, a ramp down and a few steps fit).
pub const MAX_STAGES: usize = 8;

/// One stage: the rate goes linearly from `from` to `to` over `secs`
/// (`from == to`: a constant rate). Rates may be 0 (a pause, a ramp from 0).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Stage {
    /// Rate at its start, events per second (>= 0).
    pub from: f64,
    /// Rate at its end, events per second (>= 0).
    pub to: f64,
    /// Its length, seconds (> 0).
    pub secs: f64,
}

impl Stage {
    /// Events it plans: the integral of its rate.
    pub fn events(&self) -> f64 {
        (self.from + self.to) * self.secs / 2.0
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = fmt_duration(Duration::from_secs_f64(self.secs));
        if self.from == self.to {
            write!(f, "{}/s@{secs}", self.from)
        } else {
            write!(f, "{}/s..{}/s@{secs}", self.from, self.to)
        }
    }
}

/// Stages of a rate, at most [`MAX_STAGES`], at least one; written and
/// read (in a worker's plan) as a list.
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Stage>", into = "Vec<Stage>")]
pub struct Stages {
    list: [Stage; MAX_STAGES],
    len: u8,
}

impl Stages {
    /// The stages, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.list[..usize::from(self.len)]
    }

    /// How long they last in all.
    pub fn total(&self) -> Duration {
        Duration::from_secs_f64(self.stages().iter().map(|s| s.secs).sum())
    }

    /// Events they plan in all.
    pub fn events(&self) -> f64 {
        self.stages().iter().map(Stage::events).sum()
    }
}

impl fmt::Debug for Stages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.stages()).finish()
    }
}

impl TryFrom<Vec<Stage>> for Stages {
    type Error = UnitError;

    fn try_from(v: Vec<Stage>) -> Result<Self, UnitError> {
        if v.is_empty() || v.len() > MAX_STAGES {
            return Err(UnitError(format!(
                "a rate has 1 to {MAX_STAGES} stages, not {}",
                v.len()
            )));
        }
        for s in &v {
            let ok = |r: f64| r.is_finite() && r >= 0.0;
            if !(ok(s.from) && ok(s.to) && s.secs.is_finite() && s.secs > 0.0) {
                return Err(UnitError(format!(
                    "stage {s}: rates are 0 or more per second, and its time more than zero"
                )));
            }
        }
        if v.iter().all(|s| s.events() <= 0.0) {
            return Err(UnitError(
                "the stages plan no event at all: give one a rate above 0/s".into(),
            ));
        }
        let mut list = [Stage::default(); MAX_STAGES];
        list[..v.len()].copy_from_slice(&v);
        Ok(Self {
            list,
            // Invariant: checked above, at most MAX_STAGES (16).
            len: u8::try_from(v.len()).unwrap_or(u8::MAX),
        })
    }
}

impl From<Stages> for Vec<Stage> {
    fn from(s: Stages) -> Self {
        s.stages().to_vec()
    }
}

/// `RATE[..RATE]@DURATION,...`: each stage a rate or a ramp for its time.
fn parse_stages(text: &str) -> Result<Stages, UnitError> {
    let mut list = Vec::new();
    for part in text.split(',') {
        let bad = |why: &str| {
            UnitError(format!(
                "stage '{}' {why}: write stages as RATE@TIME or FROM..TO@TIME, comma-separated, e.g. 0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s",
                part.trim()
            ))
        };
        let (rates, time) = part.split_once('@').ok_or_else(|| bad("has no @TIME"))?;
        let secs = parse_duration(time)
            .map_err(|e| bad(&format!("has a bad time ({e})")))?
            .as_secs_f64();
        let rate = |t: &str| {
            one_rate(t)
                .filter(|r| r.is_finite() && *r >= 0.0)
                .ok_or_else(|| bad(&format!("has a bad rate '{}'", t.trim())))
        };
        let (from, to) = match rates.split_once("..") {
            Some((_, b)) if b.contains("..") => {
                return Err(bad("ramps through more than two rates"));
            }
            Some((a, b)) => (rate(a)?, rate(b)?),
            None => (rate(rates)?, rate(rates)?),
        };
        list.push(Stage { from, to, secs });
    }
    Stages::try_from(list)
}

impl FromStr for RateSpec {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.contains('@') {
            return Ok(Self::Stages(parse_stages(s)?));
        }
        match s.split_once("..") {
            Some((_, b)) if b.contains("..") => Err(UnitError(format!(
                "a ramp goes from one rate to another ('{s}' has more): for up-then-down give stages with their times, e.g. 100/s..1000/s@1m,1000/s..100/s@1m"
            ))),
            Some((a, b)) => Ok(Self::Ramp(parse_rate(a)?, parse_rate(b)?)),
            None => Ok(Self::Constant(parse_rate(s)?)),
        }
    }
}

impl fmt::Display for RateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Constant(r) => write!(f, "{r}/s"),
            Self::Ramp(a, b) => write!(f, "{a}/s..{b}/s"),
            Self::Stages(s) => {
                let parts: Vec<String> = s.stages().iter().map(ToString::to_string).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

/// A duration the way the flags take it, exactly: `1h30m`, `30s`,
/// `1500ms`, `250us`, `0s`.
pub fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        let s = d.as_secs();
        if s == 0 {
            return "0s".to_owned();
        }
        let mut out = String::new();
        for (n, unit) in [(s / 3600, "h"), (s / 60 % 60, "m"), (s % 60, "s")] {
            if n > 0 {
                out.push_str(&format!("{n}{unit}"));
            }
        }
        return out;
    }
    let ns = d.as_nanos();
    if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1000 == 0 {
        format!("{}us", ns / 1000)
    } else {
        format!("{ns}ns")
    }
}

/// A byte size the way the flags take it, exactly: `64KiB`, `1GiB`, `100B`.
pub fn fmt_size(n: usize) -> String {
    let n = n as u64;
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn every_duration_any_command_took_is_taken() {
        let cases = [
            // hold, attack, bench (throng-load's parser): compounds, ns..h, bare seconds.
            ("500ms", secs(0.5)),
            ("30s", secs(30.0)),
            ("2m", secs(120.0)),
            ("1h", secs(3600.0)),
            ("1h30m", secs(5400.0)),
            ("1m30s", secs(90.0)),
            ("1.5s", secs(1.5)),
            ("1.5", secs(1.5)),
            ("10ns", Duration::from_nanos(10)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("5min", secs(300.0)),
            ("1e3", secs(1000.0)),
            // serve's: a bare number, one unit, fractions, surrounding blanks.
            ("30", secs(30.0)),
            (" 30s ", secs(30.0)),
            ("100us", Duration::from_micros(100)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (".5s", secs(0.5)),
            // report --every.
            ("10s", secs(10.0)),
            ("2h", secs(7200.0)),
            ("2", secs(2.0)),
            // New everywhere: serve --ping-interval 1h30m.
            ("1h30m15s500ms", secs(5415.5)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "s",
            "10x",
            "-5s",
            "-5",
            "1e400",
            "inf",
            "NaN",
            "fast",
            "3 weeks",
            "30 s",
            "5y",
            "1..2s",
            "101000000000",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_size_any_command_took_is_taken() {
        let cases = [
            // hold, bench (throng-load's parser).
            ("64", 64),
            ("4k", 4096),
            ("4K", 4096),
            ("4KiB", 4096),
            ("4kib", 4096),
            ("4 k", 4096),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1m", 1 << 20),
            ("100B", 100),
            ("100b", 100),
            // serve's.
            ("65536", 65536),
            ("64KiB", 65536),
            ("64k", 65536),
            ("64kb", 65536),
            ("64KB", 65536),
            ("1mb", 1 << 20),
            ("1g", 1 << 30),
            ("1gb", 1 << 30),
            // New for hold: --max-message 1GiB.
            ("1GiB", 1 << 30),
            ("2TiB", 2 << 40),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "lots",
            "1.5k",
            "-1",
            "4kbit",
            "99999999999999999999g",
            "k",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stages_parse_print_and_check() {
        let spec: RateSpec = "0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s".parse().unwrap();
        let RateSpec::Stages(st) = spec else {
            panic!("{spec:?}")
        };
        assert_eq!(st.stages().len(), 3);
        assert_eq!(
            st.stages()[1],
            Stage {
                from: 1000.0,
                to: 1000.0,
                secs: 300.0
            }
        );
        assert_eq!(st.total(), Duration::from_secs(360));
        assert_eq!(st.events(), 15_000.0 + 300_000.0 + 15_000.0);
        assert_eq!(spec.peak(), 1000.0);
        assert_eq!(
            spec.to_string(),
            "0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s"
        );
        assert_eq!(spec.to_string().parse::<RateSpec>().unwrap(), spec);
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<RateSpec>(&json).unwrap(), spec);
        let err = |t: &str| t.parse::<RateSpec>().unwrap_err().to_string();
        assert!(err("100/s..1000/s..100/s").contains("give stages with their times"));
        assert!(err("100/s@").contains("bad time"));
        assert!(err("100/s@0s").contains("more than zero"));
        assert!(err("fast@1s").contains("bad rate 'fast'"));
        assert!(err("0/s@10s").contains("no event at all"));
        assert!(err("1/s..2/s..3/s@1s").contains("more than two rates"));
        let many = ["1/s@1s"; MAX_STAGES + 1].join(",");
        assert!(err(&many).contains("1 to 8 stages"));
        assert!(serde_json::from_str::<RateSpec>(r#"{"Stages":[]}"#).is_err());
    }

    #[test]
    fn every_rate_any_command_took_is_taken() {
        let cases = [
            ("1000/s", RateSpec::Constant(1000.0)),
            ("2k/s", RateSpec::Constant(2000.0)),
            ("2K/s", RateSpec::Constant(2000.0)),
            ("5k/s", RateSpec::Constant(5000.0)),
            ("1.5k", RateSpec::Constant(1500.0)),
            ("1M/s", RateSpec::Constant(1e6)),
            ("60/m", RateSpec::Constant(1.0)),
            ("60/min", RateSpec::Constant(1.0)),
            ("3600/h", RateSpec::Constant(1.0)),
            ("1/ms", RateSpec::Constant(1000.0)),
            ("10/sec", RateSpec::Constant(10.0)),
            ("250", RateSpec::Constant(250.0)),
            ("2k / s", RateSpec::Constant(2000.0)),
            ("100/s..5000/s", RateSpec::Ramp(100.0, 5000.0)),
            ("100/s .. 5k/s", RateSpec::Ramp(100.0, 5000.0)),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<RateSpec>(), Ok(want), "{text}");
        }
        for bad in [
            "0/s",
            "-5/s",
            "fast",
            "10/fortnight",
            "inf/s",
            "NaN",
            "100/s..",
            "..5/s",
            "",
        ] {
            let err = bad.parse::<RateSpec>().unwrap_err();
            assert!(err.to_string().contains("rate"), "{bad}: {err}");
        }
    }

    #[test]
    fn counts_take_thousands_and_millions_but_not_fractions() {
        for (text, want) in [
            ("1000", 1000),
            ("10k", 10_000),
            ("10K", 10_000),
            ("1.5k", 1500),
            ("1M", 1_000_000),
            (" 250 ", 250),
            ("0", 0),
        ] {
            assert_eq!(parse_count(text), Ok(want), "{text}");
        }
        for bad in ["", "k", "1.5", "-3", "ten", "1e400", "2m", "NaN", "10k/s"] {
            let err = parse_count(bad).unwrap_err();
            assert!(err.to_string().contains("count"), "{bad}: {err}");
        }
    }

    #[test]
    fn fractions_are_percentages_or_plain_numbers() {
        for (text, want) in [
            ("0.1%", 0.001),
            ("5%", 0.05),
            ("100%", 1.0),
            ("0.001", 0.001),
            ("0", 0.0),
            (" 1 % ", 0.01),
        ] {
            let got = parse_fraction(text).unwrap();
            assert!((got - want).abs() < 1e-12, "{text}: {got}");
        }
        for bad in ["", "%", "1.5", "-1%", "200%", "lots", "NaN"] {
            let err = parse_fraction(bad).unwrap_err();
            assert!(err.to_string().contains("fraction"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_read_back_as_what_they_print() {
        for (d, text) in [
            (secs(30.0), "30s"),
            (secs(5400.0), "1h30m"),
            (secs(3600.0), "1h"),
            (secs(90.0), "1m30s"),
            (secs(1.5), "1500ms"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(fmt_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d), "{text}");
        }
        for (n, text) in [(256 * 1024, "256KiB"), (1 << 30, "1GiB"), (100, "100B")] {
            assert_eq!(fmt_size(n), text);
            assert_eq!(parse_size(text), Ok(n), "{text}");
        }
        for spec in [RateSpec::Constant(2500.0), RateSpec::Ramp(100.0, 5000.0)] {
            assert_eq!(spec.to_string().parse::<RateSpec>(), Ok(spec));
        }
        assert_eq!(RateSpec::Constant(2500.0).to_string(), "2500/s");
    }
}

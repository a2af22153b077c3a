//! Where a message the harness did not publish says when it was sent
//! (`hold --stamp`): a server that pushes on its own (the time to every
//! client each minute) is measured by its messages' own send times.
//!
//! A stamp is a Unix time whose unit is told by its magnitude: seconds
//! (with a fraction, or below 10^11), milliseconds (below 10^14),
//! microseconds (below 10^17), else nanoseconds.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where a message's send time is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stamp {
    /// Only throng's own messages (`t1 <seq> <ns>`) are timed; others are
    /// counted as foreign.
    #[default]
    Throng,
    /// A JSON object's field (a number, or a string holding one).
    Json(String),
    /// A number the message starts with (after any spaces).
    Leading,
}

/// A `--stamp` that does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid --stamp '{0}': expected throng, number, or json:FIELD")]
pub struct StampError(String);

impl std::str::FromStr for Stamp {
    type Err = StampError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "throng" => Ok(Self::Throng),
            "number" => Ok(Self::Leading),
            _ => match text.strip_prefix("json:") {
                Some(field) if !field.is_empty() => Ok(Self::Json(field.to_owned())),
                _ => Err(StampError(text.to_owned())),
            },
        }
    }
}

impl Stamp {
    /// The send time `msg` holds (ns since the Unix epoch) and, for a JSON
    /// message, its `seq` field when it has a whole number there: the
    /// server's own sequence, whose gaps are losses. `None` for
    /// [`Stamp::Throng`] or a message without a readable time.
    pub fn read(&self, msg: &[u8]) -> Option<(u64, Option<u64>)> {
        match self {
            Self::Throng => None,
            Self::Leading => {
                let text = std::str::from_utf8(&msg[..msg.len().min(64)]).ok()?;
                let text = text.trim_start();
                let end = text
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(text.len());
                Some((unix_ns(&text[..end])?, None))
            }
            Self::Json(field) => {
                let v: serde_json::Value = serde_json::from_slice(msg).ok()?;
                let sent = match v.get(field)? {
                    serde_json::Value::Number(n) => unix_ns(&n.to_string()),
                    serde_json::Value::String(s) => unix_ns(s.trim()),
                    _ => None,
                }?;
                Some((sent, v.get("seq").and_then(serde_json::Value::as_u64)))
            }
        }
    }

    /// The send time `msg` holds, ns since the Unix epoch (see [`Stamp::read`]).
    pub fn sent_ns(&self, msg: &[u8]) -> Option<u64> {
        self.read(msg).map(|(sent, _)| sent)
    }
}

/// A Unix time written in s, ms, µs or ns (told by its magnitude) as ns;
/// a whole number exactly, a fraction to a double's precision.
fn unix_ns(text: &str) -> Option<u64> {
    let scale = |v: f64| {
        if v < 1e11 {
            1_000_000_000
        } else if v < 1e14 {
            1_000_000
        } else if v < 1e17 {
            1_000
        } else {
            1
        }
    };
    if let Ok(whole) = text.parse::<u64>() {
        return whole.checked_mul(scale(whole as f64)).filter(|&ns| ns > 0);
    }
    let v: f64 = text.parse().ok()?;
    if !v.is_finite() || v <= 0.0 {
        return None;
    }
    let ns = v * scale(v) as f64;
    (ns < u64::MAX as f64).then_some(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: u64 = 1_795_320_185_123_456_789;

    #[test]
    fn the_unit_is_told_by_the_magnitude() {
        let json = Stamp::Json("t".into());
        let ms = NS / 1_000_000 * 1_000_000;
        let us = NS / 1_000 * 1_000;
        assert_eq!(
            json.sent_ns(br#"{"t":1795320185}"#),
            Some(1_795_320_185_000_000_000)
        );
        assert_eq!(
            json.sent_ns(format!(r#"{{"t":{}}}"#, NS / 1_000_000).as_bytes()),
            Some(ms)
        );
        assert_eq!(
            json.sent_ns(format!(r#"{{"t":{}}}"#, NS / 1_000).as_bytes()),
            Some(us)
        );
        assert_eq!(
            json.sent_ns(format!(r#"{{"t":"{NS}"}}"#).as_bytes()),
            Some(NS)
        );
        let frac = json.sent_ns(br#"{"t":1795320185.5}"#).unwrap();
        assert!(frac.abs_diff(1_795_320_185_500_000_000) < 1_000, "{frac}");
    }

    #[test]
    fn a_leading_number_and_what_has_none() {
        let lead = Stamp::Leading;
        assert_eq!(
            lead.sent_ns(b"  1795320185123 tick"),
            Some(1_795_320_185_123_000_000)
        );
        assert_eq!(lead.sent_ns(b"tick"), None);
        assert_eq!(Stamp::Json("t".into()).sent_ns(b"not json"), None);
        assert_eq!(Stamp::Json("t".into()).sent_ns(br#"{"u":1}"#), None);
        assert_eq!(Stamp::Throng.sent_ns(b"1795320185"), None);
    }

    #[test]
    fn a_json_seq_field_comes_with_the_time() {
        let json = Stamp::Json("t".into());
        assert_eq!(
            json.read(br#"{"t":1795320185,"seq":7}"#),
            Some((1_795_320_185_000_000_000, Some(7)))
        );
        assert_eq!(
            json.read(br#"{"t":1795320185}"#),
            Some((1_795_320_185_000_000_000, None))
        );
        assert_eq!(
            Stamp::Leading.read(b"1795320185 x"),
            Some((1_795_320_185_000_000_000, None))
        );
    }

    #[test]
    fn stamps_parse() {
        assert_eq!("json:time".parse(), Ok(Stamp::Json("time".into())));
        assert_eq!("number".parse(), Ok(Stamp::Leading));
        assert_eq!("throng".parse(), Ok(Stamp::Throng));
        assert!("json:".parse::<Stamp>().is_err());
        assert!("xml:t".parse::<Stamp>().is_err());
    }
}

//! Channel grants: the `channels` and `publish` claims of a token, each a
//! list of channel names and patterns, and whether one allows a channel.
//!
//! A pattern is one of:
//!
//! - an exact channel name: `news`;
//! - `*` alone: every channel;
//! - a prefix ending in `*`: `room.*` allows every channel starting with `room.`;
//! - an MQTT topic filter, levels split by `/`: `+` is any one level and a
//!   final `#` any number of levels, itself included (`sensors/+/temp`,
//!   `sensors/#` allows `sensors` and `sensors/42/temp`). Channel names take
//!   `/` once MQTT topics are channels; until then such a pattern simply
//!   matches nothing a WebSocket can name.
//!
//! A pattern that mixes the kinds (`a*b`, `a+/b`, `#/a`, `a/+*`) is refused
//! when the token is checked, so an issuer's typo fails loudly instead of
//! granting more, or less, than it meant.

use std::fmt;

/// The longest pattern accepted (a channel name is at most 128 bytes; a
/// filter may be a little longer than what it matches).
pub const MAX_PATTERN: usize = 256;

/// One parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every channel.
    Any,
    /// A channel name, matched whole.
    Exact(String),
    /// `prefix*`: channels starting with the prefix (not empty).
    Prefix(String),
    /// An MQTT filter with at least one `+` or `#` level.
    Filter(String),
}

/// Why a pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid channel pattern {pattern:?}: {why}")]
pub struct PatternError {
    /// The pattern, cut to [`MAX_PATTERN`] bytes.
    pub pattern: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Pattern {
    /// Parses one pattern of a grant.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let bad = |why| {
            let cut = text
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .take_while(|&end| end <= MAX_PATTERN)
                .last()
                .unwrap_or(0);
            Err(PatternError {
                pattern: text[..cut].to_owned(),
                why,
            })
        };
        if text.is_empty() {
            return bad("empty");
        }
        if text.len() > MAX_PATTERN {
            return bad("longer than 256 bytes");
        }
        if !text.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'_' | b'.' | b':' | b'-' | b'/' | b'*' | b'+' | b'#')
        }) {
            return bad("only channel characters, '/', '*', '+' and '#' may appear");
        }
        if text == "*" {
            return Ok(Self::Any);
        }
        let star = text.find('*');
        let wild = text.contains(['+', '#']);
        if let Some(at) = star {
            if at != text.len() - 1 {
                return bad("'*' may only end the pattern");
            }
            if wild {
                return bad("'*' and the MQTT wildcards '+' '#' cannot be mixed");
            }
            return Ok(Self::Prefix(text[..at].to_owned()));
        }
        if !wild {
            return Ok(Self::Exact(text.to_owned()));
        }
        let levels: Vec<&str> = text.split('/').collect();
        for (i, level) in levels.iter().enumerate() {
            if level.contains(['+', '#']) && level.len() != 1 {
                return bad("'+' and '#' must be a whole level between '/'");
            }
            if *level == "#" && i != levels.len() - 1 {
                return bad("'#' may only be the last level");
            }
        }
        Ok(Self::Filter(text.to_owned()))
    }

    /// Whether this pattern allows `channel`.
    pub fn allows(&self, channel: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(name) => name == channel,
            Self::Prefix(prefix) => channel.starts_with(prefix.as_str()),
            Self::Filter(filter) => filter_matches(filter, channel),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Exact(s) | Self::Filter(s) => f.write_str(s),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// MQTT matching (3.1.1 section 4.7): level by level; `+` takes one level,
/// a final `#` the rest, and also matches the parent level alone.
fn filter_matches(filter: &str, channel: &str) -> bool {
    let mut want = filter.split('/');
    let mut have = channel.split('/');
    loop {
        match (want.next(), have.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(w), Some(h)) if w == h => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The patterns of one claim (`channels` or `publish`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants(Vec<Pattern>);

impl Grants {
    /// Parses every pattern of a claim; the first bad one refuses the claim.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        patterns
            .iter()
            .map(|p| Pattern::parse(p.as_ref()))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether some pattern allows `channel`.
    pub fn allows(&self, channel: &str) -> bool {
        self.0.iter().any(|p| p.allows(channel))
    }

    /// No pattern at all: nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(pattern: &str, channel: &str) -> bool {
        Pattern::parse(pattern).unwrap().allows(channel)
    }

    #[test]
    fn exact_names_and_the_star() {
        assert!(allows("news", "news"));
        assert!(!allows("news", "news2"));
        assert!(!allows("news", "new"));
        assert!(allows("*", "anything.at:all"));
        assert_eq!(Pattern::parse("*").unwrap(), Pattern::Any);
    }

    #[test]
    fn a_prefix_ends_in_a_star() {
        assert!(allows("room.*", "room.1"));
        assert!(allows("room.*", "room."));
        assert!(!allows("room.*", "room"));
        assert!(!allows("room.*", "rooms.1"));
        assert!(allows("a/*", "a/b/c"), "a prefix crosses levels");
    }

    #[test]
    fn mqtt_filters_match_by_level() {
        assert!(allows("sensors/+/temp", "sensors/42/temp"));
        assert!(!allows("sensors/+/temp", "sensors/42/x/temp"));
        assert!(!allows("sensors/+/temp", "sensors/temp"));
        assert!(
            allows("sensors/+/temp", "sensors//temp"),
            "an empty level is a level"
        );
        assert!(allows("sensors/#", "sensors"));
        assert!(allows("sensors/#", "sensors/42/temp"));
        assert!(!allows("sensors/#", "sensorsx/1"));
        assert!(allows("#", "news"));
        assert!(allows("+", "news"));
        assert!(!allows("+", "a/b"));
        assert!(allows("+/+", "a/b"));
        assert!(!allows("a/+", "a"));
    }

    #[test]
    fn mixed_or_misplaced_wildcards_are_refused() {
        for bad in [
            "", "a*b", "**", "a+/b", "a/b#", "#/a", "a/+*", "a/#/b", "a b", "é", "news?x",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let long = "x".repeat(MAX_PATTERN + 1);
        let e = Pattern::parse(&long).unwrap_err();
        assert_eq!(
            e.pattern.len(),
            MAX_PATTERN,
            "the error does not carry it all"
        );
    }

    #[test]
    fn a_grant_allows_what_any_pattern_allows_and_an_empty_one_nothing() {
        let g = Grants::parse(&["news", "room.*", "s/+/t"]).unwrap();
        assert!(g.allows("news") && g.allows("room.9") && g.allows("s/1/t"));
        assert!(!g.allows("sport"));
        assert!(!Grants::default().allows("news"));
        assert!(Grants::parse(&["ok", "a*b"]).is_err());
    }
}

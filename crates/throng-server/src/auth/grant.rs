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
//! Filters are matched by the MQTT matcher of `throng-proto`
//! ([`topic::matches`]), the one subscriptions use, so a grant and a
//! subscription can never read a filter differently.
//!
//! A pattern that mixes the kinds (`a*b`, `a+/b`, `#/a`, `a/+*`) is refused
//! when the token is checked, so an issuer's typo fails loudly instead of
//! granting more, or less, than it meant.

use std::fmt;

use throng_proto::mqtt::topic;

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
        // The filter rules are MQTT's own, checked where subscriptions are.
        if topic::check_filter(text).is_err() {
            return bad("'+' and '#' must each fill a level between '/', and '#' be the last");
        }
        Ok(Self::Filter(text.to_owned()))
    }

    /// Whether this pattern allows `channel`.
    pub fn allows(&self, channel: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(name) => name == channel,
            Self::Prefix(prefix) => channel.starts_with(prefix.as_str()),
            Self::Filter(filter) => topic::matches(filter, channel),
        }
    }

    /// Whether this pattern allows every channel the MQTT topic filter
    /// `filter` (checked, with a wildcard) can match: a subscription with
    /// wildcards is a set of channels, and a grant must hold all of them.
    /// An exact name covers no wildcard filter; a prefix covers one whose
    /// levels before its first wildcard (and the `/` after them, before a
    /// `+`) start with it, since every match starts with those.
    pub fn covers(&self, filter: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(_) => false,
            Self::Prefix(prefix) => fixed_start(filter).starts_with(prefix.as_str()),
            Self::Filter(grant) => topic::covers(grant, filter),
        }
    }
}

/// What every topic a checked filter matches starts with: its levels
/// before the first wildcard, with the `/` that follows them when the
/// wildcard is `+` (`a/+` matches `a/` and more), without it when it is `#`
/// (`a/#` matches `a` itself). A filter starting with a wildcard: nothing.
/// Past this, a match may have any character, so a prefix longer than it
/// is not a prefix of some match.
fn fixed_start(filter: &str) -> &str {
    match filter.find(['+', '#']) {
        None => filter,
        Some(at) if filter.as_bytes()[at] == b'#' => &filter[..at.saturating_sub(1)],
        Some(at) => &filter[..at],
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

    /// A grant of every channel (`*`): what the publish key holds.
    pub fn all() -> Self {
        Self(vec![Pattern::Any])
    }

    /// Whether some pattern allows `channel`.
    pub fn allows(&self, channel: &str) -> bool {
        self.0.iter().any(|p| p.allows(channel))
    }

    /// Whether some pattern allows every channel the wildcard filter
    /// `filter` can match ([`Pattern::covers`]). Each pattern is asked
    /// alone: a filter that only several patterns together would cover is
    /// refused (the safe side of a question that is rarely asked).
    pub fn covers(&self, filter: &str) -> bool {
        self.0.iter().any(|p| p.covers(filter))
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

    fn covers(pattern: &str, filter: &str) -> bool {
        Pattern::parse(pattern).unwrap().covers(filter)
    }

    #[test]
    fn a_pattern_covers_a_wildcard_filter_only_when_it_allows_all_it_matches() {
        for (p, f) in [
            ("*", "#"),
            ("*", "a/+/b"),
            ("room.*", "room.1/+"),
            ("room.*", "room./#"),
            ("a/*", "a/+"),
            ("a/*", "a/b/#"),
            ("sensors/#", "sensors/+/temp"),
            ("sensors/+/temp", "sensors/+/temp"),
        ] {
            assert!(covers(p, f), "{p} should cover {f}");
        }
        for (p, f) in [
            ("a", "a/#"),
            ("a/b", "a/+"),
            ("room.*", "room/#"),
            ("room.*", "+/x"),
            ("a/*", "a/#"),
            ("ab*", "a/+"),
            ("sensors/+", "sensors/#"),
            ("sensors/+/temp", "+/+/temp"),
        ] {
            assert!(!covers(p, f), "{p} should not cover {f}");
        }
        let g = Grants::parse(&["news", "s/+/t"]).unwrap();
        assert!(g.covers("s/+/t") && !g.covers("s/#") && !Grants::default().covers("#"));
    }

    /// Over every topic of up to three levels from a small alphabet: a
    /// pattern that covers a filter allows each topic the filter matches,
    /// so a grant never lets a subscription reach more than it allows.
    #[test]
    fn covering_never_lets_a_filter_reach_a_channel_its_pattern_refuses() {
        let levels = ["a", "b", "ab", ""];
        let mut topics = Vec::new();
        for x in levels {
            topics.push(x.to_owned());
            for y in levels {
                topics.push(format!("{x}/{y}"));
                for z in levels {
                    topics.push(format!("{x}/{y}/{z}"));
                }
            }
        }
        topics.retain(|t| !t.is_empty());
        let filters = [
            "#", "+", "a/#", "a/+", "+/b", "a/+/b", "+/+", "a/b/#", "+/#", "/+", "a//#",
        ];
        let patterns = [
            "*", "a", "a*", "a/*", "ab*", "a/b*", "#", "+", "a/#", "a/+", "+/b", "+/+/#", "a/+/#",
            "/#",
        ];
        let mut covered = 0;
        for p in patterns {
            let pattern = Pattern::parse(p).unwrap();
            for f in filters {
                if !pattern.covers(f) {
                    continue;
                }
                covered += 1;
                for t in topics.iter().filter(|t| topic::matches(f, t)) {
                    assert!(pattern.allows(t), "{p} covers {f}, which matches {t}");
                }
            }
        }
        assert!(covered > 20, "the check ran on {covered} pairs only");
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

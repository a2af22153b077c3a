//! Channel names: which request targets name a channel, and why others don't.

/// The longest channel name accepted.
pub const MAX_CHANNEL: usize = 128;

/// Why a request target does not name a channel (sent as the 400 body).
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// The path is `/` or empty.
    #[error("channel name is empty: subscribe on /<channel>")]
    Empty,
    /// More than [`MAX_CHANNEL`] bytes.
    #[error("channel name is longer than 128 bytes")]
    TooLong,
    /// A byte outside `[A-Za-z0-9_.:/-]`.
    #[error("channel name may only contain A-Z a-z 0-9 _ . : / - (found byte {0:#04x})")]
    BadByte(u8),
}

/// Checks a channel name: 1 to 128 bytes of `[A-Za-z0-9_.:/-]`. `/` is
/// there for MQTT topic levels (`sensors/42/temp`, which a WebSocket
/// subscribes to at `/sensors/42/temp`); the MQTT wildcards `+` and `#`
/// are not channel bytes, so a channel name is always a topic name.
pub fn validate(name: &str) -> Result<&str, ChannelError> {
    if name.is_empty() {
        return Err(ChannelError::Empty);
    }
    if name.len() > MAX_CHANNEL {
        return Err(ChannelError::TooLong);
    }
    if let Some(b) = name
        .bytes()
        .find(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'-')))
    {
        return Err(ChannelError::BadByte(b));
    }
    Ok(name)
}

/// The channel named by a request path after `prefix` (`/` to subscribe,
/// `/publish/` to publish); a query string is ignored.
pub fn from_target<'a>(target: &'a str, prefix: &str) -> Result<&'a str, ChannelError> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let name = path.strip_prefix(prefix).unwrap_or(path);
    validate(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names() {
        for n in [
            "a",
            "news",
            "A-Z_0.9:x",
            "sensors/42/temp",
            &"x".repeat(128),
        ] {
            assert_eq!(validate(n), Ok(n));
        }
        assert_eq!(from_target("/sensors/42/temp", "/"), Ok("sensors/42/temp"));
        assert_eq!(from_target("/publish/a/b", "/publish/"), Ok("a/b"));
        assert_eq!(from_target("/room.1?token=x", "/"), Ok("room.1"));
        assert_eq!(from_target("/publish/room", "/publish/"), Ok("room"));
    }

    #[test]
    fn bad_names() {
        assert_eq!(validate(""), Err(ChannelError::Empty));
        assert_eq!(from_target("/", "/"), Err(ChannelError::Empty));
        assert_eq!(validate(&"x".repeat(129)), Err(ChannelError::TooLong));
        assert_eq!(validate("a/+"), Err(ChannelError::BadByte(b'+')));
        assert_eq!(validate("a/#"), Err(ChannelError::BadByte(b'#')));
        assert_eq!(validate("a b"), Err(ChannelError::BadByte(b' ')));
        assert_eq!(validate("é"), Err(ChannelError::BadByte(0xc3)));
    }
}

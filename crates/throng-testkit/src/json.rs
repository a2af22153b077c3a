//! Reading the JSON summaries `throng` prints.

use serde_json::Value;

/// The unsigned number at `path` in `v` (`["failed", "refused"]`), 0 when
/// it is absent: a count nothing was added to is left out of a summary.
pub fn count(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |cur, key| &cur[*key])
        .as_u64()
        .unwrap_or(0)
}

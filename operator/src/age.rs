//! Ages as operators give them (`--since`, `--older-than`, the console's
//! `since=`), bounded before they reach a statement: an age past
//! [`MAX_AGE`] would put `now() - age` outside the times Postgres (and
//! `chrono`) can hold.

use std::time::Duration;

use hookinbox::config::parse_duration_text;

/// The longest age a filter takes (`--since`, `--older-than`, the
/// console's `since=`): ten years, past any retention.
pub const MAX_AGE: Duration = Duration::from_secs(3650 * 86_400);

/// The longest text read as an age or a time; a longer one is refused
/// without being echoed.
pub const MAX_AGE_TEXT: usize = 64;

/// An age: a duration like 90s, 12h or 30d, at most [`MAX_AGE`].
pub fn parse_age(s: &str) -> Result<Duration, String> {
    if s.len() > MAX_AGE_TEXT {
        return Err(format!(
            "an age is a duration like 90s, 12h or 30d (at most {MAX_AGE_TEXT} characters)"
        ));
    }
    let age = parse_duration_text(s)?;
    if age > MAX_AGE {
        return Err(format!("'{s}' is longer than 3650d, the longest age taken"));
    }
    Ok(age)
}

//! Webhook secrets: from a variable, a file (one per line, for rotation) or
//! a config field. One rule everywhere: a trailing line ending is stripped,
//! and an empty secret is refused, because an empty HMAC key lets anyone
//! sign. Errors name the setting, never the secret.

use std::path::Path;

use super::{ConfigError, invalid};
use crate::signature::{Secret, Secrets};

/// Strips one trailing line ending (`\n` or `\r\n`), as editors and
/// `echo` add them to secret files and variables.
fn strip_line_ending(s: &str) -> &str {
    let s = s.strip_suffix('\n').unwrap_or(s);
    s.strip_suffix('\r').unwrap_or(s)
}

/// Reads a file named by the setting `name`. The error names the setting and
/// the path, never the content.
pub(super) fn read(name: &str, path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
        name: name.to_owned(),
        path: path.to_owned(),
        source,
    })
}

/// Loads the secrets from the variable or the file. An empty secret, or an
/// empty line in the file, is refused: an empty HMAC key lets anyone sign.
pub fn load_secrets(inline: Option<&str>, file: Option<&Path>) -> Result<Secrets, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid(
            "HOOKINBOX_GITHUB_SECRET",
            "set either HOOKINBOX_GITHUB_SECRET or HOOKINBOX_GITHUB_SECRET_FILE, not both",
        )),
        (None, None) => Err(invalid(
            "HOOKINBOX_GITHUB_SECRET",
            "required (or HOOKINBOX_GITHUB_SECRET_FILE)",
        )),
        (Some(value), None) => Ok(Secrets::new(vec![inline_secret(
            "HOOKINBOX_GITHUB_SECRET",
            value,
        )?])),
        (None, Some(path)) => secrets_from_lines(
            "HOOKINBOX_GITHUB_SECRET_FILE",
            &read("HOOKINBOX_GITHUB_SECRET_FILE", path)?,
        ),
    }
}

/// Parses one secret per line; the file's final line ending is optional.
pub fn secrets_from_lines(name: &str, text: &str) -> Result<Secrets, ConfigError> {
    let body = strip_line_ending(text);
    if body.is_empty() {
        return Err(ConfigError::field(
            name,
            "holds no secret; an empty secret lets anyone sign",
        ));
    }
    let mut secrets = Vec::new();
    for (i, line) in body.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return Err(ConfigError::field(
                name,
                format!("line {} is empty; an empty secret lets anyone sign", i + 1),
            ));
        }
        secrets.push(Secret::new(line));
    }
    Ok(Secrets::new(secrets))
}

/// One secret given inline, refused when empty.
pub fn inline_secret(field: &str, value: &str) -> Result<Secret, ConfigError> {
    let value = strip_line_ending(value);
    if value.is_empty() {
        return Err(ConfigError::field(
            field,
            "is empty; an empty secret lets anyone sign",
        ));
    }
    Ok(Secret::new(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_line_endings_are_stripped_and_empty_secrets_refused() {
        assert_eq!(
            load_secrets(Some("abc\r\n"), None).map(|s| s.len()).ok(),
            Some(1)
        );
        for empty in ["", "\n", "\r\n"] {
            let err = load_secrets(Some(empty), None).err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.starts_with("HOOKINBOX_GITHUB_SECRET:")));
        }
    }

    #[test]
    fn secret_file_takes_one_per_line_and_refuses_empty_lines() {
        let s = secrets_from_lines("F", "new\nold\n").map(|s| s.len());
        assert_eq!(s.ok(), Some(2));
        let s = secrets_from_lines("F", "new\r\nold").map(|s| s.len());
        assert_eq!(s.ok(), Some(2));
        let err = secrets_from_lines("F", "new\n\nold\n")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("F: line 2 is empty; an empty secret lets anyone sign")
        );
        assert!(secrets_from_lines("F", "\n").is_err());
    }
}

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

/// The largest settings file read: secrets, keys and config files are
/// small, and a mistaken path to a huge file should fail, not fill memory.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Reads a file named by the setting `name`: a regular file (or a link to
/// one, as Kubernetes mounts secrets), never a directory, a device or a
/// pipe, which could hang the read or never end it. The error names the
/// setting and the path, never the content.
pub(super) fn read(name: &str, path: &Path) -> Result<String, ConfigError> {
    let unreadable = |source| ConfigError::Unreadable {
        name: name.to_owned(),
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(ConfigError::field(
            name,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ConfigError::field(
            name,
            format!("{} is larger than 1 MiB", path.display()),
        ));
    }
    std::fs::read_to_string(path).map_err(unreadable)
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

    #[test]
    fn only_regular_files_are_read_and_errors_never_show_content() {
        let dir = std::env::temp_dir().join(format!("hookinbox-read-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let refused = |path: &Path| read("SETTING", path).err().map(|e| e.to_string());
        for not_a_file in [
            dir.as_path(),
            Path::new("/dev/null"),
            Path::new("/dev/zero"),
        ] {
            assert_eq!(
                refused(not_a_file),
                Some(format!(
                    "SETTING: {} is not a regular file",
                    not_a_file.display()
                ))
            );
        }
        let file = dir.join("secret");
        std::fs::write(&file, "s3cret\n").expect("write");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert_eq!(read("SETTING", &link).ok().as_deref(), Some("s3cret\n"));
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 2 * 1024 * 1024]).expect("write");
        assert!(refused(&big).is_some_and(|e| e.ends_with("is larger than 1 MiB")));
        let binary = dir.join("binary");
        std::fs::write(&binary, b"topsecret\xff\xfe").expect("write");
        let err = refused(&binary).expect("not UTF-8");
        assert!(err.starts_with("SETTING: cannot read"), "{err}");
        assert!(!err.contains("topsecret"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! Named tokens: who may use the console, with which role. Read from
//! `HOOKINBOX_ADMIN_TOKENS_FILE`, one `NAME ROLE SECRET` per line. A
//! presented secret is compared with every token in constant time
//! (`subtle`), over SHA-256 digests so that the length of a secret shows
//! nothing either.

use std::path::Path;

use hmac::{Hmac, Mac};
use hookinbox::config::ConfigError;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const SETTING: &str = "HOOKINBOX_ADMIN_TOKENS_FILE";

/// The shortest secret accepted: 16 characters.
pub const MIN_SECRET_LEN: usize = 16;

pub use crate::actor::{Identity, Role};

/// One token. `Debug` never shows the secret.
#[derive(Clone)]
struct Token {
    identity: Identity,
    digest: [u8; 32],
    /// Signs this token's sessions: derived from its secret, so that
    /// changing or removing the token ends its sessions.
    session_key: [u8; 32],
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// The tokens of the console.
#[derive(Clone, Debug)]
pub struct Tokens {
    tokens: Vec<Token>,
}

fn bad(line: usize, problem: impl std::fmt::Display) -> ConfigError {
    ConfigError::field(SETTING, format!("line {line}: {problem}"))
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
        mac.update(b"\0");
    }
    mac.finalize().into_bytes().into()
}

impl Tokens {
    /// Reads the tokens file named by `HOOKINBOX_ADMIN_TOKENS_FILE`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
            name: SETTING.to_owned(),
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses `NAME ROLE SECRET` lines; `#` comments and blank lines are
    /// skipped. Errors name the line, never its secret.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut tokens: Vec<Token> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, secret] = fields[..] else {
                return Err(bad(
                    n,
                    format!(
                        "expected NAME ROLE SECRET (3 fields), found {}",
                        fields.len()
                    ),
                ));
            };
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.@-".contains(&b))
            {
                return Err(bad(
                    n,
                    "the name must be 1 to 64 letters, digits, '_', '.', '@' or '-'",
                ));
            }
            let role = match role {
                "viewer" => Role::Viewer,
                "operator" => Role::Operator,
                other => {
                    return Err(bad(
                        n,
                        format!("role '{other}' is neither viewer nor operator"),
                    ));
                }
            };
            if secret.chars().count() < MIN_SECRET_LEN {
                return Err(bad(
                    n,
                    format!("the secret of '{name}' is shorter than {MIN_SECRET_LEN} characters"),
                ));
            }
            let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
            if tokens.iter().any(|t| t.identity.name == name) {
                return Err(bad(n, format!("the name '{name}' is used twice")));
            }
            if tokens.iter().any(|t| bool::from(t.digest.ct_eq(&digest))) {
                return Err(bad(
                    n,
                    format!("the secret of '{name}' is another token's secret"),
                ));
            }
            tokens.push(Token {
                identity: Identity {
                    name: name.to_owned(),
                    role,
                },
                digest,
                session_key: hmac(secret.as_bytes(), &[b"hookinbox-admin-session"]),
            });
        }
        if tokens.is_empty() {
            return Err(ConfigError::field(SETTING, "holds no token"));
        }
        Ok(Self { tokens })
    }

    /// The identity whose secret is `presented`. Every token is compared,
    /// in constant time, whatever matches.
    pub fn verify(&self, presented: &str) -> Option<Identity> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for t in &self.tokens {
            if bool::from(t.digest.ct_eq(&digest)) {
                found = Some(t.identity.clone());
            }
        }
        found
    }

    /// The tokens' names.
    pub fn names(&self) -> Vec<String> {
        self.tokens
            .iter()
            .map(|t| t.identity.name.clone())
            .collect()
    }

    /// The session key of the token named `name`.
    pub(super) fn session_key(&self, name: &str) -> Option<(&Identity, &[u8; 32])> {
        self.tokens
            .iter()
            .find(|t| t.identity.name == name)
            .map(|t| (&t.identity, &t.session_key))
    }
}

/// HMAC-SHA256 of `parts` under `key`, each part terminated by a NUL.
pub(super) fn sign(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    hmac(key, parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        "# team\n\nalice operator aaaaaaaaaaaaaaaaaaaa\nbob viewer bbbbbbbbbbbbbbbbbbbb\n";

    #[test]
    fn lines_name_role_secret_with_comments() {
        let tokens = Tokens::parse(GOOD).expect("valid");
        assert_eq!(
            tokens.verify("aaaaaaaaaaaaaaaaaaaa").map(|i| i.role),
            Some(Role::Operator)
        );
        assert_eq!(
            tokens.verify("bbbbbbbbbbbbbbbbbbbb").map(|i| i.name),
            Some("bob".to_owned())
        );
        assert_eq!(tokens.verify("aaaaaaaaaaaaaaaaaaab"), None);
        assert_eq!(tokens.verify(""), None);
    }

    #[test]
    fn bad_lines_are_named_without_their_secret() {
        for (text, want) in [
            (
                "alice operator\n",
                "line 1: expected NAME ROLE SECRET (3 fields), found 2",
            ),
            (
                "\nalice admin aaaaaaaaaaaaaaaaaaaa\n",
                "line 2: role 'admin'",
            ),
            (
                "alice operator short-secret\n",
                "line 1: the secret of 'alice' is shorter",
            ),
            (
                "a:b operator aaaaaaaaaaaaaaaaaaaa\n",
                "line 1: the name must be",
            ),
            (
                "a operator aaaaaaaaaaaaaaaaaaaa\na viewer bbbbbbbbbbbbbbbbbbbb\n",
                "line 2: the name 'a' is used twice",
            ),
            (
                "a operator aaaaaaaaaaaaaaaaaaaa\nb viewer aaaaaaaaaaaaaaaaaaaa\n",
                "line 2: the secret of 'b' is another token's secret",
            ),
            ("# nothing\n", "holds no token"),
        ] {
            let e = Tokens::parse(text).expect_err(text).to_string();
            assert!(e.starts_with(SETTING), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
            assert!(!e.contains("aaaa") && !e.contains("short-secret"), "{e}");
        }
    }
}

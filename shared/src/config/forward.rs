//! Settings of a `forward` destination: its URL, how it signs what it
//! sends (`signature`, with the destination's own `secret`), extra headers
//! (a value, or a file for a secret one), the networks it may reach in
//! spite of the egress policy (`allow_networks`), and TLS (`ca_file`,
//! `client_cert_file`, `client_key_file`).
//!
//! Every file is read once, at start; every error names the field, never a
//! secret or a file's content.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::ConfigError;
use super::secrets::{inline_secret, read};
use crate::egress::AllowNetworks;
use crate::signature::Secret;

/// The default forward timeout.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// How a `forward` destination signs each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardSignature {
    /// As GitHub does: `X-Hub-Signature-256: sha256=<HMAC-SHA256 of the
    /// body under the destination's secret>`, with GitHub's headers and
    /// `User-Agent` as received, so that an unmodified GitHub webhook
    /// receiver (an octokit or Probot app) verifies it with its own secret.
    Github,
    /// `X-Hookinbox-Signature-256: sha256=<hex>` under the destination's
    /// secret.
    Hookinbox,
    /// No signature header.
    None,
}

impl ForwardSignature {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Github => "github",
            Self::Hookinbox => "hookinbox",
            Self::None => "none",
        }
    }
}

/// One extra request header of a destination. A value read from a file is
/// marked sensitive: its `Debug` shows `Sensitive`, and it is never
/// logged.
#[derive(Clone, Debug)]
pub struct ExtraHeader {
    /// Its name (lower case).
    pub name: HeaderName,
    /// Its value.
    pub value: HeaderValue,
}

impl ExtraHeader {
    /// Whether its value came from a file (a secret).
    pub fn is_secret(&self) -> bool {
        self.value.is_sensitive()
    }
}

/// TLS settings of a destination beyond the defaults.
#[derive(Clone, Default)]
pub struct ForwardTls {
    /// Trust only these certificate authorities (`ca_file`), instead of
    /// the built-in roots.
    pub roots: Option<Vec<reqwest::Certificate>>,
    /// Present this client certificate (`client_cert_file` and
    /// `client_key_file`).
    pub identity: Option<reqwest::Identity>,
}

impl fmt::Debug for ForwardTls {
    // Never the key; only what is set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardTls")
            .field("roots", &self.roots.as_ref().map(Vec::len))
            .field("identity", &self.identity.as_ref().map(|_| "set"))
            .finish()
    }
}

/// Settings of a `forward` destination.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Where to POST.
    pub url: reqwest::Url,
    /// The destination's own secret, signing each request as `signature`
    /// says.
    pub secret: Option<Secret>,
    /// How requests are signed.
    pub signature: ForwardSignature,
    /// Request timeout.
    pub timeout: Duration,
    /// Extra request headers.
    pub headers: Vec<ExtraHeader>,
    /// Networks this destination may reach in spite of the egress policy:
    /// its own `allow_networks` and `HOOKINBOX_FORWARD_ALLOW_NETWORKS`.
    pub allow_networks: AllowNetworks,
    /// A hosts file consulted before DNS (`HOOKINBOX_FORWARD_HOSTS_FILE`),
    /// re-read at every resolution.
    pub hosts_file: Option<PathBuf>,
    /// TLS beyond the defaults.
    pub tls: ForwardTls,
}

impl ForwardConfig {
    /// A destination with the defaults: signed the hookinbox way when it
    /// has a secret, no extra header, no allowed network, default TLS.
    pub fn new(url: reqwest::Url, secret: Option<Secret>, timeout: Duration) -> Self {
        let signature = if secret.is_some() {
            ForwardSignature::Hookinbox
        } else {
            ForwardSignature::None
        };
        Self {
            url,
            secret,
            signature,
            timeout,
            headers: Vec::new(),
            allow_networks: AllowNetworks::default(),
            hosts_file: None,
            tls: ForwardTls::default(),
        }
    }
}

/// What replaces a secret value in an answer shown or kept
/// ([`mask_secret_values`]).
pub const REDACTED: &str = "[redacted]";

/// The shortest word of a secret value masked on its own: shorter words
/// (`Bearer`, `Basic`, `token`) are a scheme, not the secret.
const MIN_SECRET_WORD: usize = 8;

impl ForwardConfig {
    /// The values a receiver's answer must never be kept or shown with:
    /// each header value read from a file (a secret), and each word of it
    /// long enough to be a credential (the token of `Bearer <token>`), as
    /// a receiver may echo either. Longest first, so that a value is
    /// masked whole before its words are. The signing secret is not among
    /// them: only its HMAC leaves this process.
    pub fn secret_values(&self) -> Vec<String> {
        let mut all = Vec::new();
        for header in self.headers.iter().filter(|h| h.is_secret()) {
            let Ok(value) = header.value.to_str() else {
                continue;
            };
            all.push(value.to_owned());
            all.extend(
                value
                    .split_whitespace()
                    .filter(|w| w.len() >= MIN_SECRET_WORD && *w != value)
                    .map(str::to_owned),
            );
        }
        sort_secret_values(&mut all);
        all
    }
}

/// Orders secret values longest first, without repeats or empty ones.
pub fn sort_secret_values(values: &mut Vec<String>) {
    values.retain(|v| !v.is_empty());
    values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    values.dedup();
}

/// `bytes` with every occurrence of each of `values` (longest first, see
/// [`ForwardConfig::secret_values`]) replaced by [`REDACTED`].
pub fn mask_secret_values(bytes: &[u8], values: &[String]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for value in values.iter().map(String::as_bytes) {
        if value.is_empty() || !out.windows(value.len()).any(|w| w == value) {
            continue;
        }
        let mut masked = Vec::with_capacity(out.len());
        let mut at = 0;
        while at < out.len() {
            if out[at..].starts_with(value) {
                masked.extend_from_slice(REDACTED.as_bytes());
                at += value.len();
            } else {
                masked.push(out[at]);
                at += 1;
            }
        }
        out = masked;
    }
    out
}

/// A header's value as written: plain text, or `{ file = "…" }` for a
/// secret.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum FileHeaderValue {
    Plain(String),
    File(FileHeaderFile),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileHeaderFile {
    file: PathBuf,
}

/// The fields of a forward destination as written, each optional.
#[derive(Default)]
pub(super) struct ForwardFields {
    pub(super) secret: Option<String>,
    pub(super) secret_file: Option<PathBuf>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) signature: Option<String>,
    pub(super) headers: Option<BTreeMap<String, FileHeaderValue>>,
    pub(super) allow_networks: Option<Vec<String>>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) client_cert_file: Option<PathBuf>,
    pub(super) client_key_file: Option<PathBuf>,
}

/// Headers hookinbox sets itself, or that would change how the request is
/// framed or signed: never taken from `headers`.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "user-agent",
    "idempotency-key",
    "x-hub-signature",
    "x-hub-signature-256",
    "x-hookinbox-signature-256",
];

/// The settings of a `forward` destination (or of a source's old forward
/// handler), `at` naming each field.
pub(super) fn forward_config(
    at: &dyn Fn(&str) -> String,
    url: &str,
    fields: ForwardFields,
) -> Result<ForwardConfig, ConfigError> {
    let url = parse_forward_url(&at("url"), url)?;
    let secret = match (fields.secret, fields.secret_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::field(
                &at("secret"),
                "give secret or secret_file, not both",
            ));
        }
        (Some(s), None) => Some(inline_secret(&at("secret"), &s)?),
        (None, Some(file)) => {
            let field = at("secret_file");
            Some(inline_secret(&field, &read(&field, &file)?)?)
        }
        (None, None) => None,
    };
    if fields.timeout_ms == Some(0) {
        return Err(ConfigError::field(&at("timeout_ms"), "must be at least 1"));
    }
    let timeout = fields
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_FORWARD_TIMEOUT);
    let mut config = ForwardConfig::new(url, secret, timeout);
    if let Some(signature) = fields.signature {
        config.signature = signature_of(
            &at("signature"),
            &signature,
            config.secret.is_some(),
            "secret or secret_file",
        )?;
    }
    config.headers = headers(at, fields.headers.unwrap_or_default())?;
    if let Some(networks) = fields.allow_networks {
        config.allow_networks = AllowNetworks::parse(networks.iter().map(String::as_str))
            .map_err(|e| ConfigError::field(&at("allow_networks"), e))?;
    }
    config.tls = tls(
        at,
        config.url.scheme() == "https",
        fields.ca_file.as_deref(),
        fields.client_cert_file.as_deref(),
        fields.client_key_file.as_deref(),
    )?;
    Ok(config)
}

/// The `signature` setting `value`, named `field` in errors, checked
/// against whether the destination has a secret (`secret` names the
/// settings that give it, for the errors): `github` and `hookinbox` sign with it, `none`
/// must not have one.
pub(super) fn signature_of(
    field: &str,
    value: &str,
    has_secret: bool,
    secret: &str,
) -> Result<ForwardSignature, ConfigError> {
    let signature = match value {
        "github" => ForwardSignature::Github,
        "hookinbox" => ForwardSignature::Hookinbox,
        "none" => ForwardSignature::None,
        other => {
            return Err(ConfigError::field(
                field,
                format!("'{other}' is not github, hookinbox or none"),
            ));
        }
    };
    match (signature, has_secret) {
        (ForwardSignature::None, true) => Err(ConfigError::field(
            field,
            format!(
                "is none, but a secret is given ({secret}): remove it or choose github or \
                 hookinbox"
            ),
        )),
        (ForwardSignature::Github | ForwardSignature::Hookinbox, false) => Err(ConfigError::field(
            field,
            format!(
                "{} needs the destination's secret ({secret})",
                signature.as_str()
            ),
        )),
        _ => Ok(signature),
    }
}

fn headers(
    at: &dyn Fn(&str) -> String,
    written: BTreeMap<String, FileHeaderValue>,
) -> Result<Vec<ExtraHeader>, ConfigError> {
    let mut all = Vec::with_capacity(written.len());
    for (name, value) in written {
        let field = at(&format!("headers.{name}"));
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::field(&field, "is not a valid header name"))?;
        if RESERVED_HEADERS.contains(&parsed.as_str())
            || parsed
                .as_str()
                .starts_with(crate::job::GITHUB_HEADER_PREFIX)
            || parsed.as_str().starts_with("proxy-")
        {
            return Err(ConfigError::field(
                &field,
                "is set by hookinbox itself (or frames the request) and cannot be given",
            ));
        }
        let (text, secret) = match value {
            FileHeaderValue::Plain(text) => (text, false),
            FileHeaderValue::File(FileHeaderFile { file }) => {
                let file_field = format!("{field}.file");
                let text = read(&file_field, &file)?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let text = text.strip_suffix('\r').unwrap_or(text).to_owned();
                if text.is_empty() {
                    return Err(ConfigError::field(&file_field, "is empty"));
                }
                (text, true)
            }
        };
        // The error never shows the value: it may be a secret.
        let mut value = HeaderValue::from_str(&text).map_err(|_| {
            ConfigError::field(
                &field,
                "is not a valid header value (visible ASCII, spaces and tabs)",
            )
        })?;
        value.set_sensitive(secret);
        all.push(ExtraHeader {
            name: parsed,
            value,
        });
    }
    Ok(all)
}

fn tls(
    at: &dyn Fn(&str) -> String,
    https: bool,
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<ForwardTls, ConfigError> {
    let given = [
        ("ca_file", ca_file.is_some()),
        ("client_cert_file", cert_file.is_some()),
        ("client_key_file", key_file.is_some()),
    ];
    if let Some((field, _)) = given.iter().find(|(_, g)| *g).filter(|_| !https) {
        return Err(ConfigError::field(
            &at(field),
            "is only for an https:// url",
        ));
    }
    let roots = match ca_file {
        None => None,
        Some(path) => {
            let field = at("ca_file");
            let pem = read(&field, path)?;
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .ok()
                .filter(|certs| !certs.is_empty())
                .ok_or_else(|| {
                    ConfigError::field(
                        &field,
                        format!("{} holds no PEM certificate", path.display()),
                    )
                })?;
            Some(certs)
        }
    };
    let identity = match (cert_file, key_file) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::field(
                &at("client_key_file"),
                "is required with client_cert_file",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::field(
                &at("client_cert_file"),
                "is required with client_key_file",
            ));
        }
        (Some(cert), Some(key)) => {
            let cert_field = at("client_cert_file");
            let key_field = at("client_key_file");
            let mut pem = read(&cert_field, cert)?;
            pem.push('\n');
            pem.push_str(&read(&key_field, key)?);
            // The error names the files, never their content.
            Some(reqwest::Identity::from_pem(pem.as_bytes()).map_err(|_| {
                ConfigError::field(
                    &cert_field,
                    format!(
                        "{} and {} are not a PEM certificate and its private key",
                        cert.display(),
                        key.display()
                    ),
                )
            })?)
        }
    };
    Ok(ForwardTls { roots, identity })
}

/// Parses a forward URL (http or https).
pub fn parse_forward_url(field: &str, raw: &str) -> Result<reqwest::Url, ConfigError> {
    let url = reqwest::Url::parse(raw)
        .map_err(|e| ConfigError::field(field, format!("not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ConfigError::field(
            field,
            "must be an http:// or https:// URL with a host",
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(field: &str) -> String {
        format!("d.{field}")
    }

    fn load(fields: ForwardFields) -> Result<ForwardConfig, String> {
        forward_config(&at, "https://example.com/hook", fields).map_err(|e| e.to_string())
    }

    #[test]
    fn the_signature_defaults_to_the_secret_and_needs_one() {
        let none = load(ForwardFields::default()).expect("valid");
        assert_eq!(none.signature, ForwardSignature::None);
        let signed = load(ForwardFields {
            secret: Some("s".into()),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(signed.signature, ForwardSignature::Hookinbox);
        let github = load(ForwardFields {
            secret: Some("s".into()),
            signature: Some("github".into()),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(github.signature, ForwardSignature::Github);
        for (signature, secret, error) in [
            (
                "github",
                None,
                "d.signature: github needs the destination's secret",
            ),
            ("hookinbox", None, "d.signature: hookinbox needs"),
            (
                "none",
                Some("s"),
                "d.signature: is none, but a secret is given",
            ),
            (
                "sha1",
                None,
                "d.signature: 'sha1' is not github, hookinbox or none",
            ),
        ] {
            let err = load(ForwardFields {
                secret: secret.map(str::to_owned),
                signature: Some(signature.into()),
                ..Default::default()
            })
            .expect_err(signature);
            assert!(err.starts_with(error), "{err}");
        }
    }

    #[test]
    fn headers_take_a_value_or_a_secret_file_and_never_a_reserved_name() {
        let dir = std::env::temp_dir().join(format!("hookinbox-headers-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let token = dir.join("token");
        std::fs::write(&token, "Bearer t0ken-value\n").expect("write");
        let parsed: BTreeMap<String, FileHeaderValue> = toml::from_str(&format!(
            "Authorization = {{ file = \"{}\" }}\nX-Team = \"ci\"\n",
            token.display()
        ))
        .expect("toml");
        let config = load(ForwardFields {
            headers: Some(parsed),
            ..Default::default()
        })
        .expect("valid");
        let shown = format!("{config:?}");
        assert!(!shown.contains("t0ken-value"), "{shown}");
        let auth = &config.headers[0];
        assert_eq!(auth.name.as_str(), "authorization");
        assert!(auth.is_secret());
        assert_eq!(auth.value.as_bytes(), b"Bearer t0ken-value");
        assert!(!config.headers[1].is_secret());
        for reserved in [
            "X-Hub-Signature-256",
            "x-github-event",
            "Content-Type",
            "Idempotency-Key",
            "Host",
        ] {
            let parsed: BTreeMap<String, FileHeaderValue> =
                toml::from_str(&format!("\"{reserved}\" = \"x\"\n")).expect("toml");
            let err = load(ForwardFields {
                headers: Some(parsed),
                ..Default::default()
            })
            .expect_err(reserved);
            assert!(err.contains("is set by hookinbox itself"), "{err}");
        }
        let bad: BTreeMap<String, FileHeaderValue> =
            toml::from_str("X-Bad = \"s3cret\\nline\"\n").expect("toml");
        let err = load(ForwardFields {
            headers: Some(bad),
            ..Default::default()
        })
        .expect_err("a line break");
        assert!(!err.contains("s3cret"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn secret_header_values_and_their_long_words_are_masked() {
        let values = vec![
            "Bearer t0ken-value-1".to_owned(),
            "t0ken-value-1".to_owned(),
        ];
        let masked = mask_secret_values(
            b"bad Authorization: Bearer t0ken-value-1; token t0ken-value-1",
            &values,
        );
        assert_eq!(
            String::from_utf8_lossy(&masked),
            "bad Authorization: [redacted]; token [redacted]"
        );
        assert_eq!(mask_secret_values(b"nothing", &values), b"nothing");
    }

    #[test]
    fn tls_files_are_for_https_and_come_in_pairs() {
        let err = forward_config(
            &at,
            "http://example.com/",
            ForwardFields {
                ca_file: Some("/nowhere".into()),
                ..Default::default()
            },
        )
        .expect_err("http")
        .to_string();
        assert_eq!(err, "d.ca_file: is only for an https:// url");
        let err = load(ForwardFields {
            client_cert_file: Some("/nowhere".into()),
            ..Default::default()
        })
        .expect_err("no key");
        assert_eq!(err, "d.client_key_file: is required with client_cert_file");
        let dir = std::env::temp_dir().join(format!("hookinbox-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let err = load(ForwardFields {
            ca_file: Some(junk.clone()),
            ..Default::default()
        })
        .expect_err("junk");
        assert!(err.ends_with("holds no PEM certificate"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn allow_networks_are_cidrs() {
        let config = load(ForwardFields {
            allow_networks: Some(vec!["10.0.0.0/8".into(), "fd00::1".into()]),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(config.allow_networks.networks().len(), 2);
        let err = load(ForwardFields {
            allow_networks: Some(vec!["10.0.0.0/99".into()]),
            ..Default::default()
        })
        .expect_err("bad");
        assert!(err.starts_with("d.allow_networks: '10.0.0.0/99'"), "{err}");
    }
}

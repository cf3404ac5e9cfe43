//! Page sessions, kept in Postgres (`admin_sessions`, see
//! `0007_admin_sessions.sql`) so that each ends when it should: at
//! sign-out, when an operator revokes it, when it expires (12 hours), and
//! when its token is removed from or changed in the tokens file.
//!
//! The cookie (`HttpOnly`, `SameSite=Strict`) holds a random 256-bit
//! value; the table holds its SHA-256, never the value. Each row also
//! holds `token_check`, an HMAC of the value under a key derived from the
//! token's secret: a session is honoured only while it verifies against
//! the tokens file read at start, so a changed secret ends its sessions
//! at their next request, and a removed token's are ended at start. The
//! CSRF token every changing form carries is an HMAC of the cookie's
//! value: bound to the session, and never stored.

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::{self, Session as Db};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::AdminError;
use super::tokens::{Identity, Tokens, sign};

/// The session cookie's name.
pub const COOKIE: &str = "hookinbox_admin";

/// How long a session lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// A signed-in page session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Its row (0 under `--insecure-loopback`, which has no sessions).
    pub id: i64,
    /// Who signed in, with the role the tokens file gives now.
    pub identity: Identity,
    /// The token forms must carry.
    pub csrf: String,
}

/// Why a session ended, as `admin_sessions.revoked_why` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its owner signed out.
    SignedOut,
    /// An operator revoked it.
    Revoked,
    /// Its token is no longer in the tokens file.
    TokenRemoved,
    /// Its token's secret is not the one it was issued under.
    TokenChanged,
}

impl Ended {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SignedOut => "signed out",
            Self::Revoked => "revoked",
            Self::TokenRemoved => "token removed",
            Self::TokenChanged => "token changed",
        }
    }
}

/// A live session, as the console lists it.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Its id (revoked by it).
    pub id: i64,
    /// The token's name.
    pub token_name: String,
    /// The client that signed in.
    pub client: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// When it ends on its own.
    pub expires_at: DateTime<Utc>,
}

/// The cookie's value: 32 random bytes, hex.
const VALUE_LEN: usize = 64;

fn digest(value: &str) -> Vec<u8> {
    Sha256::digest(value.as_bytes()).to_vec()
}

fn token_check(session_key: &[u8], value: &str) -> Vec<u8> {
    sign(session_key, &[b"session", value.as_bytes()]).to_vec()
}

fn csrf_of(value: &str) -> String {
    hex::encode(sign(value.as_bytes(), &[b"csrf"]))
}

/// Ended sessions are deleted this long after their end.
const FORGET: &str = "
delete from admin_sessions
where expires_at < now() - interval '30 days' or revoked_at < now() - interval '30 days'";

const ISSUE: &str = "
insert into admin_sessions (cookie_sha256, token_name, token_check, client, expires_at)
values ($1, $2, $3, $4, now() + make_interval(secs => $5))
returning id";

/// Starts a session for `identity` (whose secret was just verified),
/// signed in from `from`; returns the cookie's value.
pub async fn issue(
    client: &impl Db,
    tokens: &Tokens,
    identity: &Identity,
    from: IpAddr,
) -> Result<String, AdminError> {
    let (_, key) = tokens
        .session_key(&identity.name)
        .ok_or(AdminError::Unauthorized)?;
    let value = hex::encode(rand::random::<[u8; 32]>());
    sql::execute(client, FORGET, &[]).await?;
    let row = sql::query_one(
        client,
        ISSUE,
        &[
            &digest(&value),
            &identity.name,
            &token_check(key, &value),
            &from.to_string(),
            &LIFETIME.as_secs_f64(),
        ],
    )
    .await?;
    let id: i64 = row.get(0);
    tracing::info!(session = id, actor = %identity.name, client = %from, "admin session started");
    Ok(value)
}

const FIND: &str = "
select id, token_name, token_check from admin_sessions
where cookie_sha256 = $1 and revoked_at is null and expires_at > now()";

/// The live session a cookie value stands for, if any. A session whose
/// token is gone or changed is ended here, at its first request since.
pub async fn check(
    client: &impl Db,
    tokens: &Tokens,
    value: &str,
) -> Result<Option<Session>, DbError> {
    if value.len() != VALUE_LEN || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let Some(row) = sql::query_opt(client, FIND, &[&digest(value)]).await? else {
        return Ok(None);
    };
    let (id, name, stored): (i64, String, Vec<u8>) = (row.get(0), row.get(1), row.get(2));
    let Some((identity, key)) = tokens.session_key(&name) else {
        end(client, id, Ended::TokenRemoved, None).await?;
        return Ok(None);
    };
    if !bool::from(token_check(key, value).ct_eq(&stored)) {
        end(client, id, Ended::TokenChanged, None).await?;
        return Ok(None);
    }
    Ok(Some(Session {
        id,
        identity: identity.clone(),
        csrf: csrf_of(value),
    }))
}

const END: &str = "
update admin_sessions set revoked_at = now(), revoked_why = $2, revoked_by = $3
where id = $1 and revoked_at is null and expires_at > now()
returning token_name";

/// Ends the live session `id`; returns its token's name, or `None` when
/// it had ended already (or never was).
pub async fn end(
    client: &impl Db,
    id: i64,
    why: Ended,
    by: Option<&str>,
) -> Result<Option<String>, DbError> {
    let row = sql::query_opt(client, END, &[&id, &why.as_str(), &by]).await?;
    let name: Option<String> = row.map(|r| r.get(0));
    if let Some(name) = &name {
        tracing::info!(session = id, actor = %name, why = why.as_str(), by, "admin session ended");
    }
    Ok(name)
}

const END_REMOVED: &str = "
update admin_sessions set revoked_at = now(), revoked_why = $2
where revoked_at is null and expires_at > now() and not (token_name = any($1))";

/// Ends the live sessions of tokens no longer in the file (at start).
pub async fn end_removed(client: &impl Db, tokens: &Tokens) -> Result<u64, DbError> {
    let names = tokens.names();
    let n = sql::execute(
        client,
        END_REMOVED,
        &[&names, &Ended::TokenRemoved.as_str()],
    )
    .await?;
    if n > 0 {
        tracing::info!(
            sessions = n,
            "admin sessions ended: their tokens are no longer in the tokens file"
        );
    }
    Ok(n)
}

const LIVE: &str = "
select id, token_name, client, created_at, expires_at from admin_sessions
where revoked_at is null and expires_at > now()
order by id desc
limit $1";

/// The live sessions, newest first, at most `limit`.
pub async fn live(client: &impl Db, limit: i64) -> Result<Vec<Listed>, DbError> {
    Ok(sql::query(client, LIVE, &[&limit])
        .await?
        .iter()
        .map(|r| Listed {
            id: r.get(0),
            token_name: r.get(1),
            client: r.get(2),
            created_at: r.get(3),
            expires_at: r.get(4),
        })
        .collect())
}

/// An operator revokes the session `id`: ended, with its audit row, in
/// one transaction.
pub async fn revoke(
    pool: &deadpool_postgres::Pool,
    who: &Identity,
    id: i64,
) -> Result<(), AdminError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(name) = end(&tx, id, Ended::Revoked, Some(&who.name)).await? else {
        return Err(AdminError::NotFound(format!("no live session {id}")));
    };
    crate::audit::record(
        &tx,
        who,
        "revoke_session",
        &serde_json::json!({"session": id, "token": name}),
        1,
        "revoked",
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The CSRF token of the console without sign-in (`--insecure-loopback`):
/// one per process, from a random key.
pub fn loopback_csrf(process_key: &[u8; 32]) -> String {
    hex::encode(sign(process_key, &[b"csrf", b"loopback"]))
}

/// Whether a form's CSRF token is the expected one, in constant time.
pub fn csrf_matches(expected: &str, given: &str) -> bool {
    bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_is_bound_to_the_cookie_and_compared_whole() {
        let a = hex::encode([1u8; 32]);
        let b = hex::encode([2u8; 32]);
        assert_ne!(csrf_of(&a), csrf_of(&b));
        assert!(csrf_matches(&csrf_of(&a), &csrf_of(&a)));
        assert!(!csrf_matches(&csrf_of(&a), &csrf_of(&b)));
        assert!(!csrf_matches(&csrf_of(&a), ""));
        assert!(!csrf_matches(&csrf_of(&a), &csrf_of(&a)[..10]));
    }

    #[test]
    fn a_changed_secret_gives_another_token_check() {
        let old = Tokens::parse("bob viewer bbbbbbbbbbbbbbbbbbbb\n").expect("valid");
        let new = Tokens::parse("bob viewer cccccccccccccccccccc\n").expect("valid");
        let value = hex::encode([7u8; 32]);
        let check = |t: &Tokens| token_check(t.session_key("bob").expect("bob").1, &value);
        assert_ne!(check(&old), check(&new));
        assert_eq!(check(&old), check(&old));
    }
}

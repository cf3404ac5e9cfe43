-- The admin console's page sessions, kept on the server so that one ends
-- when it should: at sign-out, when an operator revokes it, and when its
-- token is removed from (or changed in) the tokens file.
--
-- The cookie holds a random 256-bit value; only its SHA-256 is stored, so
-- a reader of this table cannot present a session. `token_check` is an
-- HMAC of the cookie's value under a key derived from the token's secret:
-- a session is honoured only while it verifies, so changing a token's
-- secret ends its sessions, and the table holds nothing that can test a
-- guessed secret without the cookie.
create table admin_sessions (
    -- The handle the console lists and revokes a session by.
    id            bigserial   primary key,
    cookie_sha256 bytea       not null unique,
    token_name    text        not null,
    token_check   bytea       not null,
    -- The client that signed in (the peer, or the forwarded address behind
    -- a trusted proxy).
    client        text        not null,
    created_at    timestamptz not null default now(),
    expires_at    timestamptz not null,
    revoked_at    timestamptz,
    -- Who revoked it (a token name), none when it was signed out or its
    -- token went away.
    revoked_by    text,
    -- 'signed out', 'revoked', 'token removed' or 'token changed'.
    revoked_why   text,
    check ((revoked_at is null) = (revoked_why is null))
);
-- The console's list: sessions still live, newest first.
create index admin_sessions_live on admin_sessions (id) where revoked_at is null;

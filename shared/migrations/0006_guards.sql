-- The replay guard. GitHub signs only the body: X-GitHub-Delivery and
-- X-GitHub-Hook-ID are not signed, so a captured request resent under a
-- fresh delivery id (or another hook id) would verify and run again. Each
-- accepted body is kept per source, for as long as completed deliveries
-- are; a body seen before under another key is refused, inside the claim
-- statement itself (see deliveries/claim.rs).
create table seen_bodies (
    provider    text        not null,
    source      text        not null,
    body_sha256 bytea       not null,
    hook_id     text        not null,
    delivery_id text        not null,
    seen_at     timestamptz not null default now(),
    primary key (provider, source, body_sha256)
);
create index seen_bodies_seen_at on seen_bodies (seen_at);

-- Raised by a claim whose body was seen before under another key: the
-- statement fails as a whole, so the refused claim leaves no row behind.
create function hookinbox_replayed_body() returns boolean
language plpgsql volatile as $$
begin
    raise exception 'this body was received before under another delivery id or hook id'
        using errcode = 'HB409';
end
$$;

-- github_events gets a retention of its own (HOOKINBOX_EVENTS_RETENTION_DAYS).
create index github_events_received on github_events (received_at);

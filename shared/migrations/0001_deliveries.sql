-- One row per delivery key: the state machine of src/deliveries.rs.
create table deliveries (
    provider         text        not null,
    source           text        not null,
    hook_id          text        not null default '',
    delivery_id      text        not null,
    event            text        not null,
    action           text,
    body_sha256      bytea       not null,
    status           text        not null
        check (status in ('processing', 'completed', 'failed')),
    retryable        boolean     not null default false,
    -- Fencing token: every transition after the claim is guarded by it.
    claim_token      uuid        not null,
    -- Never NULL while processing: the claim covers the time in the queue.
    lease_until      timestamptz,
    -- When ingest installed the current token; a duplicate republishes an
    -- untaken claim only once this is older than the publish timeout.
    claimed_at       timestamptz not null default now(),
    attempts         integer     not null default 0,
    replays          integer     not null default 0,
    next_attempt_at  timestamptz,
    created_at       timestamptz not null default now(),
    completed_at     timestamptz,
    failed_at        timestamptz,
    first_failed_at  timestamptz,
    -- Set once the dead-letter copy of a failed delivery is confirmed.
    dead_lettered_at timestamptz,
    last_error_class text,
    last_error       text,
    primary key (provider, source, hook_id, delivery_id),
    constraint processing_has_lease check (status <> 'processing' or lease_until is not null)
);

-- The reaper and the oldest-processing gauge scan live leases.
create index deliveries_processing_lease on deliveries (lease_until) where status = 'processing';
-- The retry scheduler picks due rows.
create index deliveries_due on deliveries (next_attempt_at) where status = 'failed' and retryable;
-- Operators list by state and age.
create index deliveries_status_created on deliveries (status, created_at);

-- The `store` handler's effect: one row per delivery key, written in the
-- transaction that completes the delivery.
create table github_events (
    provider    text        not null,
    source      text        not null,
    hook_id     text        not null,
    delivery_id text        not null,
    event       text        not null,
    action      text,
    payload     jsonb       not null,
    received_at timestamptz not null,
    primary key (provider, source, hook_id, delivery_id)
);

-- Destinations (docs/architecture.md, "Destinations and legs"): a delivery
-- runs once per destination that takes it, as a leg, and a leg is a row of
-- `deliveries`, keyed by the delivery's key and the destination's name.
-- Every transition of the state machine addresses one leg.

-- Rows from before have the empty destination: they finish the old way
-- (their source's first destination, through the old shared queue). The
-- default stays for the same reason: an ingest of the previous version,
-- still running during a rolling upgrade, writes such legs.
alter table parked_bodies
    drop constraint parked_bodies_provider_source_hook_id_delivery_id_fkey;
alter table deliveries add column destination text not null default '';
alter table parked_bodies add column destination text not null default '';
alter table deliveries drop constraint deliveries_pkey,
    add primary key (provider, source, hook_id, delivery_id, destination);
alter table parked_bodies drop constraint parked_bodies_pkey,
    add primary key (provider, source, hook_id, delivery_id, destination);
alter table parked_bodies
    add foreign key (provider, source, hook_id, delivery_id, destination)
        references deliveries on delete cascade;

-- A destination whose filters did not take the delivery gets a `filtered`
-- leg, terminal, with the reason: "why didn't ci get it?" has an answer.
alter table deliveries drop constraint deliveries_status_check,
    add constraint deliveries_status_check
        check (status in ('processing', 'completed', 'failed', 'filtered'));
alter table deliveries add column filter_reason text;
-- The breaker's probe: a destination's oldest waiting leg.
create index deliveries_waiting on deliveries (source, destination, next_attempt_at)
    where status = 'failed' and retryable;
-- Filtered legs are swept with completed ones, by the time they were
-- decided (`completed_at`).
create index deliveries_filtered on deliveries (completed_at) where status = 'filtered';

-- The takes a leg may have in all, from its destination's retry schedule,
-- written by each take: the global statements (the scheduler, the
-- exhaustion pass, the claim's reclaim guard) bound each leg by its own.
-- Null until the first take: HOOKINBOX_MAX_ATTEMPTS then.
alter table deliveries add column max_attempts integer;

-- One row per destination, shared by the fleet: the circuit breaker's
-- state (docs/architecture.md, "The circuit breaker"). Workers register
-- their configured destinations at start.
create table destinations (
    source        text        not null,
    name          text        not null,
    kind          text        not null,
    state         text        not null default 'closed'
        check (state in ('closed', 'open', 'half_open', 'paused', 'disabled')),
    state_since   timestamptz not null default now(),
    -- Why and by whom it last changed state: `breaker` or an operator.
    changed_by    text,
    -- When the breaker opened (disable_after counts from it).
    opened_at     timestamptz,
    -- While open: when the next probe may go.
    probe_at      timestamptz,
    -- The claim token of the leg out as the probe; its take passes the gate.
    probe_token   uuid,
    -- From the configuration, written at each registration: the pause
    -- between probes, and how long it may stay open before it is disabled.
    probe_secs    integer     not null default 30,
    disable_after_secs bigint not null default 259200,
    last_error    text,
    last_error_at timestamptz,
    registered_at timestamptz not null default now(),
    primary key (source, name)
);

-- Every attempt of a leg whose destination keeps a log (forward, and any
-- with a breaker): the breaker's window and the console's per-attempt log.
-- Written by a group commit of its own, beside the leg's transitions.
create table destination_attempts (
    id               bigserial   primary key,
    at               timestamptz not null default now(),
    provider         text        not null,
    source           text        not null,
    hook_id          text        not null,
    delivery_id      text        not null,
    destination      text        not null,
    attempt          integer     not null,
    probe            boolean     not null default false,
    -- ok, transient, permanent, destination (the destination itself is
    -- wrong or down), blocked (refused before sending).
    result           text        not null,
    status_code      integer,
    error            text,
    duration_ms      double precision not null,
    -- The first 4 KiB of the answer's body.
    response_excerpt bytea
);
-- The breaker's window: a destination's attempts by time.
create index destination_attempts_window on destination_attempts (source, destination, at);
-- A leg's attempts, for the console.
create index destination_attempts_leg
    on destination_attempts (provider, source, hook_id, delivery_id, destination, at);

-- A bulk job's items are legs.
alter table admin_job_items add column destination text not null default '';
drop index admin_job_items_delivery;
create index admin_job_items_delivery
    on admin_job_items (provider, source, hook_id, delivery_id, destination);

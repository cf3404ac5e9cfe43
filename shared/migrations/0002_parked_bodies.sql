-- The raw body of every delivery that is not in flight: written in the
-- same statement as the failure that parks it, deleted by completion,
-- retention (cascade) and purge. The retry scheduler and replays publish
-- from here, so Postgres, not the broker, is the record.
create table parked_bodies (
    provider     text        not null,
    source       text        not null,
    hook_id      text        not null,
    delivery_id  text        not null,
    content_type text        not null,
    -- The original X-GitHub-* request headers, as [[name, value], ...].
    headers      jsonb       not null,
    body         bytea       not null,
    parked_at    timestamptz not null default now(),
    primary key (provider, source, hook_id, delivery_id),
    foreign key (provider, source, hook_id, delivery_id)
        references deliveries on delete cascade
);

-- Dead letters, listed and purged by age.
create index deliveries_dead on deliveries (failed_at) where status = 'failed' and not retryable;
-- Retention sweeps completed rows by age.
create index deliveries_completed on deliveries (completed_at) where status = 'completed';

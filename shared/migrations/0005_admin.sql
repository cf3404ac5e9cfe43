-- The admin console (`hookinbox-worker admin`): the repository column its
-- filter reads, the indexes its lists and counts use, its audit log, and
-- its bulk jobs with their frozen selections.

-- `repository.full_name` of the payload, extracted by ingest with `action`;
-- null when the event has no repository (and for rows claimed before).
alter table deliveries add column repository text;

-- The console's lists and counts. Each list is newest first
-- (`created_at desc`, then the key); each filter has an index led by its
-- column, with `created_at` second, so that a page and a count read only
-- the rows that match.
--
-- They are partial, `status <> 'processing'`: a delivery passes through
-- two processing versions (claim, take) before it settles, and a partial
-- index gets an entry only for a version its predicate holds for, so
-- each of these costs the hot path one index entry per delivery instead
-- of three. Processing rows, few at any time, are read through
-- `deliveries_status_created` instead: every list and count is the union
-- of a processing branch and a settled one (shared/src/deliveries/filter.rs).
create index deliveries_settled_created on deliveries (created_at)
    where status <> 'processing';
create index deliveries_settled_source on deliveries (source, created_at)
    where status <> 'processing';
create index deliveries_settled_event on deliveries (event, created_at) include (action)
    where status <> 'processing';
-- An action without its event (`opened` of issues and pull requests alike).
create index deliveries_settled_action on deliveries (action, created_at)
    where status <> 'processing' and action is not null;
create index deliveries_settled_repository on deliveries (repository, created_at)
    where status <> 'processing' and repository is not null;
-- Only rows that ever failed have a class.
create index deliveries_settled_error_class on deliveries (last_error_class, created_at)
    where status <> 'processing' and last_error_class is not null;
-- A delivery id, or a prefix of one (a byte-wise range: text_pattern_ops).
create index deliveries_settled_delivery_id on deliveries (delivery_id text_pattern_ops)
    where status <> 'processing';
-- Failed rows (dead letters and pending retries: the console's busiest
-- filters) read without touching the table: lists, counts, and the
-- overview's figures per source and class. Only failed versions get an
-- entry, so the hot path pays nothing for it until a delivery fails.
create index deliveries_failed_created on deliveries (created_at)
    include (retryable, source, event, last_error_class)
    where status = 'failed';
-- The overview's failures of the last hour.
create index deliveries_settled_failed_at on deliveries (failed_at)
    where status <> 'processing' and failed_at is not null;

-- Bulk replays and purges. The selection is frozen when the operator
-- confirms: its keys are the job's items, in order, so the job acts on
-- exactly what was counted and shown, whatever arrives meanwhile.
create table admin_jobs (
    id           bigserial   primary key,
    kind         text        not null check (kind in ('replay', 'purge')),
    -- The token name of the operator who started it.
    actor        text        not null,
    -- The filter the selection was made with (null for a list of ids).
    filter       jsonb,
    per_second   float8      not null check (per_second > 0),
    status       text        not null default 'running'
        check (status in ('running', 'cancelled', 'finished')),
    total        integer     not null,
    created_at   timestamptz not null default now(),
    finished_at  timestamptz,
    cancelled_by text,
    -- Which console process runs it, and until when: another takes the
    -- job over once the lease has expired (its runner died).
    runner       uuid,
    lease_until  timestamptz
);
create index admin_jobs_running on admin_jobs (id) where status = 'running';

create table admin_job_items (
    job_id      bigint      not null references admin_jobs on delete cascade,
    position    integer     not null,
    provider    text        not null,
    source      text        not null,
    hook_id     text        not null,
    delivery_id text        not null,
    -- null while pending; then replayed, purged, skipped (no longer
    -- eligible when its turn came) or failed (the publish failed).
    result      text check (result in ('replayed', 'purged', 'skipped', 'failed')),
    error       text,
    done_at     timestamptz,
    primary key (job_id, position)
);
-- A delivery's lineage: the jobs that replayed (or purged) it. A replay is
-- in place (the row goes failed -> processing, replays + 1), so these rows
-- are its `replay_of` record.
create index admin_job_items_delivery
    on admin_job_items (provider, source, hook_id, delivery_id);
-- The runner's next pending item.
create index admin_job_items_pending on admin_job_items (job_id, position) where result is null;

-- Every change an operator makes through the console: one row each.
create table admin_audit (
    id       bigserial   primary key,
    at       timestamptz not null default now(),
    actor    text        not null,
    role     text        not null,
    action   text        not null,
    -- The filter or the ids (or the delivery) it applied to.
    target   jsonb       not null,
    count    bigint      not null,
    result   text        not null,
    job_id   bigint      references admin_jobs on delete set null
);

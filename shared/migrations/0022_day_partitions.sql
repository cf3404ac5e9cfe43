-- Storage by day (docs/architecture.md, "Storage at volume"): the two
-- append-only tables that grow with every delivery, `github_events` (the
-- `store` handler's payloads) and `destination_attempts` (every attempt's
-- log), are partitioned by day, and retention drops whole days instead of
-- deleting rows. The worker's sweep creates the days ahead and drops the
-- days past retention (deliveries/partitions.rs):
--
-- - `<table>_pYYYYMMDD`: one UTC day;
-- - `<table>_default`: the DEFAULT partition, for a row of a day without a
--   partition (a leg that completes after its day was dropped, say);
--   normally empty, so that creating a day, which must check that the
--   DEFAULT partition holds none of its rows, reads next to nothing;
-- - `<table>_to_YYYYMMDD`: the rows from before this migration, as they
--   were (no row copied): everything before that day, which is tomorrow
--   at the time of the migration. Swept by rows, dropped whole once that
--   day is past retention. A database without such rows gets none.
--
-- The tables that carry a uniqueness stay whole: `deliveries` (the claim:
-- a redelivery days later must find its first claim, and a unique index on
-- a partitioned table must include the partition key) and `seen_bodies`
-- (the replay guard: one body per source, whenever it was first seen).
-- Their rows are narrow, without bodies. `parked_bodies` stays whole too:
-- its rows are deleted one by one when their legs complete, so it holds
-- only the legs not in flight, and days would not spare it any delete.

-- github_events: one row per claim of a delivery, `received_at` the
-- delivery row's `created_at` (fixed by its claim); see
-- deliveries/complete.rs.
alter table github_events rename to github_events_old;
alter table github_events_old drop constraint github_events_pkey;
alter index github_events_received rename to github_events_old_received;
create table github_events (
    like github_events_old including defaults including storage including compression
) partition by range (received_at);
alter table github_events
    add primary key (provider, source, hook_id, delivery_id, received_at);
create index github_events_received on github_events (received_at);
create table github_events_default partition of github_events default;

-- destination_attempts: its ids keep their sequence.
alter table destination_attempts rename to destination_attempts_old;
alter table destination_attempts_old drop constraint destination_attempts_pkey;
alter index destination_attempts_window rename to destination_attempts_old_window;
alter index destination_attempts_leg rename to destination_attempts_old_leg;
create table destination_attempts (
    like destination_attempts_old including defaults including storage
) partition by range (at);
alter table destination_attempts add primary key (id, at);
create index destination_attempts_window on destination_attempts (source, destination, at);
create index destination_attempts_leg
    on destination_attempts (provider, source, hook_id, delivery_id, destination, at);
create table destination_attempts_default partition of destination_attempts default;
alter sequence destination_attempts_id_seq owned by destination_attempts.id;

-- The old rows: attached as everything before tomorrow (one read of each
-- old table, to check that bound), or dropped if there are none.
do $$
declare
    tomorrow date := (now() at time zone 'UTC')::date + 1;
    t text;
    i text;
    old_rows boolean;
begin
    foreach t in array array['github_events', 'destination_attempts'] loop
        execute format('select exists (select 1 from %I)', t || '_old') into old_rows;
        if old_rows then
            execute format('alter table %I rename to %I',
                           t || '_old', t || '_to_' || to_char(tomorrow, 'YYYYMMDD'));
            execute format('alter table %I attach partition %I for values from (minvalue) to (%L)',
                           t, t || '_to_' || to_char(tomorrow, 'YYYYMMDD'),
                           to_char(tomorrow, 'YYYY-MM-DD') || ' 00:00:00+00');
            -- Its indexes are named after it, as the other partitions' are.
            for i in select c.relname from pg_index x join pg_class c on c.oid = x.indexrelid
                     where x.indrelid = (t || '_to_' || to_char(tomorrow, 'YYYYMMDD'))::regclass
                       and c.relname like t || '\_old\_%' loop
                execute format('alter index %I rename to %I', i,
                               replace(i, t || '_old_', t || '_to_' || to_char(tomorrow, 'YYYYMMDD') || '_'));
            end loop;
        else
            execute format('drop table %I', t || '_old');
        end if;
    end loop;
end
$$;

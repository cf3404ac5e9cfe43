-- Storage by day (docs/architecture.md, "Storage at volume"): the two
-- append-only tables that grow with every delivery, `github_events` (the
-- `store` handler's payloads) and `destination_attempts` (every attempt's
-- log), are partitioned by day, and retention drops whole days instead of
-- deleting rows. Partitions are named `<table>_pYYYYMMDD` and cover one UTC
-- day; the worker's sweep creates them ahead (deliveries/partitions.rs).
--
-- The tables that carry a uniqueness stay whole: `deliveries` (the claim:
-- a redelivery days later must find its first claim, and a unique index on
-- a partitioned table must include the partition key) and `seen_bodies`
-- (the replay guard: one body per source, whenever it was first seen).
-- Their rows are narrow, without bodies. `parked_bodies` stays whole too:
-- its rows are deleted one by one when their legs complete, so it holds
-- only the legs not in flight, and days would not spare it any delete.
--
-- Each old table becomes its new parent's DEFAULT partition, as it is: no
-- row is copied. Rows for a day without a partition of its own (today's,
-- until tomorrow's partition takes over; a leg claimed before the
-- migration that completes after it) land there, and the sweep deletes
-- them in batches the old way.

-- github_events: one row per delivery key, `received_at` the delivery
-- row's `created_at` (fixed by the first claim). The key alone is no
-- longer unique across days; the completing statement keeps it exact (see
-- deliveries/complete.rs).
alter table github_events rename to github_events_default;
-- Its key gives way to the parent's (the attach builds it).
alter table github_events_default drop constraint github_events_pkey;
alter index github_events_received rename to github_events_default_received;
create table github_events (
    like github_events_default including defaults including storage including compression
) partition by range (received_at);
alter table github_events
    add primary key (provider, source, hook_id, delivery_id, received_at);
create index github_events_received on github_events (received_at);
alter table github_events attach partition github_events_default default;

-- destination_attempts: its ids keep their sequence.
alter table destination_attempts rename to destination_attempts_default;
alter table destination_attempts_default drop constraint destination_attempts_pkey;
alter index destination_attempts_window rename to destination_attempts_default_window;
alter index destination_attempts_leg rename to destination_attempts_default_leg;
create table destination_attempts (
    like destination_attempts_default including defaults including storage
) partition by range (at);
alter table destination_attempts add primary key (id, at);
create index destination_attempts_window on destination_attempts (source, destination, at);
create index destination_attempts_leg
    on destination_attempts (provider, source, hook_id, delivery_id, destination, at);
alter table destination_attempts attach partition destination_attempts_default default;
alter sequence destination_attempts_id_seq owned by destination_attempts.id;

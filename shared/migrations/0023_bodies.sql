-- Postgres is the record of every delivery, body included
-- (docs/architecture.md, "The record: bodies in Postgres"). The claim
-- writes each delivery's raw body once, in its own statement, and every
-- message after it carries only the leg's key: a message the broker loses
-- is published again from here, a leg that waits changes state without
-- writing its body again, and any delivery whose body is kept can be
-- replayed, completed ones too.
--
-- One row per delivery, not per leg, partitioned by the day of the
-- delivery's first claim: `received_at` is its legs' `created_at` (one
-- claim statement writes both, at one `now()`), which every read joins on,
-- so that a read finds its one partition. Retention drops a day whole,
-- after moving the bodies of deliveries with a leg not yet ended to the
-- DEFAULT partition (deliveries/bodies.rs).
create table bodies (
    provider     text        not null,
    source       text        not null,
    hook_id      text        not null,
    delivery_id  text        not null,
    received_at  timestamptz not null,
    content_type text        not null,
    -- The request headers a destination or an operator needs
    -- (`X-GitHub-*` and `User-Agent`, never a signature header), as
    -- [[name, value], ...].
    headers      jsonb       not null,
    -- The body's length as received, in bytes.
    size         integer     not null,
    -- 'lz4': an LZ4 block, compressed by ingest (its length is `size`);
    -- 'identity': the bytes as received (bodies moved from parked_bodies).
    encoding     text        not null check (encoding in ('lz4', 'identity')),
    body         bytea       not null,
    primary key (provider, source, hook_id, delivery_id, received_at)
) partition by range (received_at);
-- Compressed already: Postgres keeps the bytes as they are. Each
-- partition is made with `toast_tuple_target = 8160`, so that a body of
-- up to about 8 KB compressed (nearly every GitHub payload) stays in its
-- row instead of going to the TOAST table: one write, one read.
alter table bodies alter column body set storage external;
create table bodies_default partition of bodies default with (toast_tuple_target = 8160);

-- The days ahead, as the sweep makes them (deliveries/partitions.rs), so
-- that the bodies claimed before the first sweep go to their day.
do $$
declare
    today date := (now() at time zone 'UTC')::date;
    d date;
begin
    for i in 0..7 loop
        d := today + i;
        execute format(
            'create table %I partition of bodies for values from (%L) to (%L) '
            'with (toast_tuple_target = 8160)',
            'bodies_p' || to_char(d, 'YYYYMMDD'),
            to_char(d, 'YYYY-MM-DD') || ' 00:00:00+00',
            to_char(d + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    end loop;
end
$$;

-- The DEFAULT partition keeps the bodies of deliveries with a leg not yet
-- ended past their day: the sweep finds those past retention by age.
create index bodies_default_received on bodies_default (received_at);

-- The parked bodies (one per leg that was not in flight) become the
-- delivery's one body, as received. A leg whose message is in the queue
-- now carries its body in that message (a message published before this
-- version); the worker writes it here when Postgres holds none.
insert into bodies (provider, source, hook_id, delivery_id, received_at, content_type,
                    headers, size, encoding, body)
select distinct on (p.provider, p.source, p.hook_id, p.delivery_id)
       p.provider, p.source, p.hook_id, p.delivery_id, d.created_at, p.content_type,
       p.headers, length(p.body), 'identity', p.body
from parked_bodies p
join deliveries d using (provider, source, hook_id, delivery_id, destination)
order by p.provider, p.source, p.hook_id, p.delivery_id, p.parked_at;
delete from parked_bodies;

-- `parked_bodies` stays, empty, for the ingests and workers of the
-- previous version still running during a rolling upgrade: their
-- statements write and delete there. What they park is copied into
-- `bodies` at once, so that this version publishes it again. A later
-- version drops the table and this trigger.
create function hookinbox_adopt_parked_body() returns trigger language plpgsql as $$
begin
    insert into bodies (provider, source, hook_id, delivery_id, received_at, content_type,
                        headers, size, encoding, body)
    select new.provider, new.source, new.hook_id, new.delivery_id, d.created_at,
           new.content_type, new.headers, length(new.body), 'identity', new.body
    from deliveries d
    where d.provider = new.provider and d.source = new.source and d.hook_id = new.hook_id
      and d.delivery_id = new.delivery_id and d.destination = new.destination
    on conflict do nothing;
    return new;
end $$;
create trigger adopt_parked_body after insert on parked_bodies
    for each row execute function hookinbox_adopt_parked_body();

-- A replay of any delivery whose body is kept, completed ones too
-- (`deliveries replay`, the console's delivery page): a job of its own
-- kind, beside the replay of failed legs (`dlq replay`), so that each job
-- acts only on the legs its selection was made of.
alter table admin_jobs drop constraint admin_jobs_kind_check,
    add constraint admin_jobs_kind_check check (kind in ('replay', 'replay_any', 'purge'));

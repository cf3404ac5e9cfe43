-- `skip_stale` (docs/architecture.md, "Ordered legs"): a destination
-- ordered by pull request may skip a leg whose payload's `updated_at` (the
-- pull request's or issue's) is older than that of a completed leg of its
-- key. The claim records that time on such legs only.
alter table deliveries add column stale_clock timestamptz;
-- A key's completed legs by that time: is there a newer one?
create index deliveries_stale_done
    on deliveries (source, destination, order_key, stale_clock)
    where order_key is not null and stale_clock is not null and status = 'completed';

-- Ordered destinations (docs/architecture.md, "Ordered legs"): a leg of a
-- destination with `ordering` carries its key (the repository's id, or the
-- repository's id and a pull request's or issue's number) and its place in
-- the key's claim order. Per key only the first open leg may be taken:
-- one in flight, in claim order.
alter table deliveries add column order_key text;
-- Assigned from `deliveries_order_seq` by the claim while it holds the
-- key's advisory lock, so a key's places are in the order its claims
-- commit: a take that sees a leg sees every earlier leg of its key.
alter table deliveries add column order_seq bigint;
-- An operator's skip of a leg that halted its key: it stays failed, and no
-- longer holds the key.
alter table deliveries add column order_skipped_at timestamptz;
alter table deliveries add column order_skipped_by text;
create sequence deliveries_order_seq;
-- A key's open legs in claim order: the take's gate, the scheduler's wake
-- of a key's next leg, and the list of halted keys.
create index deliveries_ordered_open
    on deliveries (source, destination, order_key, order_seq)
    where order_key is not null and status in ('processing', 'failed')
      and order_skipped_at is null;

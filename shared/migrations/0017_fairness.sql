-- Fair destinations (docs/architecture.md, "Fairness"): a leg of a
-- destination with `fairness` on carries its installation (the payload's
-- `installation.id`, or '' for none) and the installation's share of legs
-- in flight. While another installation's leg waits for its take, a leg
-- whose installation already has `fair_cap` legs in flight waits in
-- Postgres (class 'fair') instead, and goes again when one of them ends;
-- with `fair_hard` (an explicit `per_key_concurrency`) it waits so even
-- when no other installation does.
alter table deliveries add column fair_key text;
alter table deliveries add column fair_cap integer;
alter table deliveries add column fair_hard boolean;
-- An installation's legs in flight (taken, or published again for a
-- retry): the gate counts at most `fair_cap` of them.
create index deliveries_fair_running
    on deliveries (source, destination, fair_key)
    where fair_key is not null and status = 'processing' and attempts > 0;
-- Legs claimed and not taken yet: is another installation waiting?
create index deliveries_fair_queued
    on deliveries (source, destination, fair_key)
    where fair_key is not null and status = 'processing' and attempts = 0;
-- Legs waiting behind their installation's cap, oldest first.
create index deliveries_fair_waiting
    on deliveries (source, destination, fair_key, failed_at)
    where fair_key is not null and status = 'failed' and last_error_class = 'fair';

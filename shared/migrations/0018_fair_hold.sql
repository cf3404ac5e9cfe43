-- Fair destinations hold a flooding installation's new legs in Postgres
-- from the claim (docs/architecture.md, "Fairness") once it has two rounds
-- queued or running, a round being the destination's `concurrency` (per
-- worker) times the workers consuming its queue. The worker that samples
-- the gauges writes that count here every 10 s.
alter table destinations add column consumers integer;

-- Fair destinations hold a flooding installation's new legs in Postgres
-- from the claim (docs/architecture.md, "Fairness") once it has about as
-- many queued or running as the workers can run at once: the destination's
-- `concurrency` (per worker) times the workers consuming its queue. The
-- worker that samples the gauges writes that count here every 10 s.
alter table destinations add column consumers integer;

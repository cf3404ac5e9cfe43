-- A fair destination's hold grows with its pace (docs/architecture.md,
-- "Fairness"): the legs it completed a second over the sampler's last ten
-- seconds, written by the worker that samples the gauges beside
-- `consumers`. The claim holds an installation's new legs once it has a
-- round queued or running, or what the destination completes in 50 ms if
-- that is more: a fast destination is not slowed by releases when one
-- installation sends most of its deliveries, and another installation's
-- leg still waits behind at most 50 ms of them.
alter table destinations add column fair_rate integer;

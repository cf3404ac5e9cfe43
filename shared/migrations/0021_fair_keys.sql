-- How many installations a fair destination served over the sampler's
-- last ten seconds (docs/architecture.md, "Fairness"), written by the
-- worker that samples the gauges beside `consumers` and `fair_rate`. With
-- one (or none measured) there is nobody to be fair to: the installation
-- may have a second of the destination's pace queued before its new legs
-- are held, so that a stream near the machine's limit is not pushed onto
-- the held path (a second write, a release and a publish per leg) by its
-- own bursts. With two or more, the hold is 50 ms of the pace, as before.
alter table destinations add column fair_keys integer;

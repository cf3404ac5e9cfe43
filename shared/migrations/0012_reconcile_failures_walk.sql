-- The reconciler asks GitHub's log for failed deliveries only
-- (`status=failure`) on most passes, and walks the whole log (successes
-- too, to judge deliveries GitHub saw succeed and hookinbox holds no row
-- of) every HOOKINBOX_RECONCILE_FULL_EVERY_SECS. `watermark` is how far
-- the failures were judged; `full_watermark` how far everything was.
-- Until now every pass walked the whole log, so both start equal.
alter table reconcile_state add column full_watermark timestamptz;
update reconcile_state set full_watermark = watermark;

-- Traces (docs/operations.md, "Traces"): the W3C `traceparent` of the
-- reconciler's span that asked GitHub to redeliver a GUID, written with
-- the ask when traces are on (null otherwise). GitHub's redelivery arrives
-- as a new request with the same X-GitHub-Delivery: ingest's claim reads
-- the newest one of its source and GUID, and the request's span links to
-- that trace. The partial index keeps the claim's lookup to the rows that
-- have one (none at all with traces off).
alter table reconcile_redeliveries add column traceparent text;
create index reconcile_redeliveries_traced on reconcile_redeliveries (source, guid)
    where traceparent is not null;

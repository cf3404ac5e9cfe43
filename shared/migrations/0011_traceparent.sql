-- Traces (docs/operations.md, "Traces"): the W3C `traceparent` of the
-- ingest request that first claimed a leg, written by the claim when
-- traces are on (null otherwise). A retry, the breaker's probe and an
-- operator replay publish the leg again from its parked body; their
-- worker span starts a trace of its own and links back to this one.
alter table deliveries add column traceparent text;

-- A handler's "not now, try at T" (docs/architecture.md, "Deferred legs"):
-- when the leg was first deferred. A deferral spends no attempt, so this
-- is what bounds them: a leg whose next time would fall past
-- deferred_since + its destination's retry horizon fails as
-- deferred_too_long instead. Null for a leg never deferred.
alter table deliveries add column deferred_since timestamptz;

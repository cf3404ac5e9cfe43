-- Stored payloads and parked bodies are tens of kilobytes, so most are
-- compressed as they are written, in the statement that completes (or
-- fails) the delivery. lz4 compresses them at about half the CPU cost of
-- the default (pglz). Where the server was built without lz4 the columns
-- keep the default.
do $$
begin
    alter table github_events alter column payload set compression lz4;
    alter table parked_bodies alter column body set compression lz4;
exception when feature_not_supported then
    raise notice 'lz4 is not available: payloads keep the default compression';
end
$$;

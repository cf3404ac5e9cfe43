-- One event sent to two hooks of a source that does not pin its hook ids
-- (a repository's hook and an organization's, say) arrives twice with the
-- same X-GitHub-Delivery and the same body under two X-GitHub-Hook-IDs.
-- The second is a copy of the event, not a replayed capture (a replay
-- comes under a fresh delivery id): the claim statement raises this
-- instead of hookinbox_replayed_body(), failing as a whole so that the
-- copy leaves no row behind, and ingest answers it as a duplicate (see
-- deliveries/claim.rs).
create function hookinbox_copied_event() returns boolean
language plpgsql volatile as $$
begin
    raise exception 'this event was received before under another hook id of this source'
        using errcode = 'HB200';
end
$$;

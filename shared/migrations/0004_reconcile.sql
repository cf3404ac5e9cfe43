-- The reconciler: GitHub never retries a failed delivery, so a worker reads
-- each configured hook's delivery log and asks GitHub to redeliver what
-- hookinbox never durably took.

-- Progress per source. A pass walks GitHub's log back to `watermark` minus
-- an overlap (deliveries can appear in the log late); the watermark moves
-- only when a pass completes, so a crash mid-pass loses nothing.
create table reconcile_state (
    source          text primary key,
    -- The hook the watermark belongs to (`repo:OWNER/REPO/ID`, `org:ORG/ID`,
    -- `app`): a source pointed at another hook starts over.
    hook            text        not null,
    -- The X-GitHub-Hook-ID its deliveries carry (learned for an App's hook).
    hook_id         text,
    -- Every delivery GitHub logged before this was judged by a complete pass.
    watermark       timestamptz,
    last_pass_at    timestamptz,
    last_attempt_at timestamptz,
    last_error      text,
    -- The last complete pass's counts (scanned, redelivered, late, ...).
    last_counts     jsonb
);

-- Redeliveries asked, per hook and GUID: the loop guard across passes. A row
-- is written before each request to GitHub, so a crash between the request
-- and its answer still counts against the cap.
create table reconcile_redeliveries (
    hook           text        not null,
    guid           text        not null,
    source         text        not null,
    asked          integer     not null default 0,
    first_asked_at timestamptz not null default now(),
    last_asked_at  timestamptz not null default now(),
    -- asked (no answer recorded yet), accepted, refused (422), failed.
    last_result    text        not null,
    primary key (hook, guid)
);
create index reconcile_redeliveries_age on reconcile_redeliveries (last_asked_at);

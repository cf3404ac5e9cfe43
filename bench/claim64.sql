-- B_pgB: 64 claims per transaction in one UNNEST upsert.
\set base random(1, 30000000)
insert into deliveries as d
    (provider, source, hook_id, delivery_id, event, action, body_sha256,
     status, claim_token, lease_until, claimed_at)
select 'github', 'bench', '64', (:base::bigint * 64 + g)::text, 'push', null, '\x00'::bytea,
       'processing', gen_random_uuid(), now() + interval '60 seconds', now()
from unnest(array(select generate_series(1, 64))) as g
on conflict (provider, source, hook_id, delivery_id) do update
    set status = 'processing', claim_token = excluded.claim_token,
        lease_until = excluded.lease_until, claimed_at = excluded.claimed_at
    where d.body_sha256 = excluded.body_sha256
      and d.status = 'processing' and d.lease_until < now()
returning (xmax = 0);

-- GitHub Enterprise Cloud with data residency (GHE.com) sends
-- `X-GitHub-Tenant` with each delivery: the enterprise's tenant, whose API
-- is https://api.<tenant>.ghe.com. Kept with each leg as it arrived (null
-- for github.com and GitHub Enterprise Server). Like every X-GitHub-*
-- header it is not covered by the signature.
alter table deliveries add column github_tenant text;

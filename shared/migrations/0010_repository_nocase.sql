-- GitHub's repository names are not case-sensitive (`Octo-Org/Hello-World`
-- and `octo-org/hello-world` are one repository), so the operators'
-- `--repository` filter compares `lower(repository)`
-- (shared/src/deliveries/filter.rs). This index serves it as the one it
-- replaces served the exact comparison; the stored name keeps GitHub's
-- case.
create index deliveries_settled_repository_nocase on deliveries (lower(repository), created_at)
    where status <> 'processing' and repository is not null;
drop index deliveries_settled_repository;

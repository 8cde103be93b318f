-- A random id per revision (issue 25): after a failover to a lagging standby the next commits
-- reuse revision numbers with other content, and a replica tells "the revision I indexed" from
-- "another revision with the same number" by this id. Revisions from before it read 0.
ALTER TABLE vxds_revisions ADD COLUMN commit_id BIGINT NOT NULL DEFAULT 0;

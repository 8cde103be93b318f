-- A variant's TTL in milliseconds (issue 10, TTL and heartbeats): clients drop the resource
-- when it runs out without an update or a heartbeat. NULL: no TTL.
ALTER TABLE vxds_variants ADD COLUMN ttl_ms BIGINT;

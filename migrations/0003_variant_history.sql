-- Every variant set a revision wrote, kept: what a past revision's state was, for restoring
-- it (`POST /v1/revisions/{n}/restore`) and showing what a revision changed. A resource's
-- state right after revision N is the variant set of its latest change at or before N (none
-- when that change deleted it).
CREATE TABLE vxds_variant_history (
    revision BIGINT NOT NULL,
    type_url TEXT NOT NULL,
    name TEXT NOT NULL,
    position BIGINT NOT NULL,
    variant_id TEXT NOT NULL,
    constraints TEXT NOT NULL,
    body BYTEA NOT NULL,
    version TEXT NOT NULL,
    -- The variant's TTL in milliseconds (0002); NULL: none.
    ttl_ms BIGINT,
    PRIMARY KEY (type_url, name, revision, position)
);

-- Revisions committed before this table existed: only the current variant sets are known,
-- each at the revision that last wrote it. Earlier states of those resources cannot be
-- restored.
INSERT INTO vxds_variant_history
    (revision, type_url, name, position, variant_id, constraints, body, version, ttl_ms)
SELECT r.revision, v.type_url, v.name, v.position, v.variant_id, v.constraints, v.body, v.version,
       v.ttl_ms
FROM vxds_variants v JOIN vxds_resources r ON r.type_url = v.type_url AND r.name = v.name;

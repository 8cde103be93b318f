-- The variant store, for Postgres and SQLite alike. Timestamps are Unix milliseconds. SQLite
-- takes BYTEA as a type name (NUMERIC affinity, which never converts a blob) and BIGINT as
-- INTEGER.

-- One row: the head revision. Writers lock it first, which serialises changesets and makes
-- revision numbers gap-free.
CREATE TABLE vxds_head (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);
INSERT INTO vxds_head (id, revision) VALUES (1, 0);

-- Every committed changeset, kept: the history and the change feed.
CREATE TABLE vxds_revisions (
    revision BIGINT PRIMARY KEY,
    created_at_ms BIGINT NOT NULL,
    author TEXT,
    message TEXT
);

CREATE TABLE vxds_revision_changes (
    revision BIGINT NOT NULL REFERENCES vxds_revisions (revision),
    type_url TEXT NOT NULL,
    name TEXT NOT NULL,
    change TEXT NOT NULL CHECK (change IN ('created', 'updated', 'deleted')),
    -- The resource's version after the change; NULL when deleted.
    version TEXT,
    PRIMARY KEY (revision, type_url, name)
);
CREATE INDEX vxds_revision_changes_by_resource ON vxds_revision_changes (type_url, name, revision);

CREATE TABLE vxds_resources (
    type_url TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    revision BIGINT NOT NULL,
    created_revision BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (type_url, name)
);

CREATE TABLE vxds_variants (
    type_url TEXT NOT NULL,
    name TEXT NOT NULL,
    position BIGINT NOT NULL,
    variant_id TEXT NOT NULL,
    -- Canonical constraints in the compact text syntax; '*' when unconstrained.
    constraints TEXT NOT NULL,
    -- The body, an encoded google.protobuf.Any.
    body BYTEA NOT NULL,
    version TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (type_url, name, position),
    UNIQUE (type_url, name, variant_id),
    FOREIGN KEY (type_url, name) REFERENCES vxds_resources (type_url, name) ON DELETE CASCADE
);

-- Aggregate cluster -> the clusters it points to, over all its variants, for the graph rules.
CREATE TABLE vxds_cluster_edges (
    parent TEXT NOT NULL,
    child TEXT NOT NULL,
    PRIMARY KEY (parent, child)
);

-- TP1 redirects: a resource (any of whose variants is an xds.core.v3.ResourceLocator) -> the
-- resources it points to, of the same type, for the one-hop rule (no chains, no cycles).
CREATE TABLE vxds_redirects (
    type_url TEXT NOT NULL,
    name TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (type_url, name, target)
);
CREATE INDEX vxds_redirects_by_target ON vxds_redirects (type_url, target);

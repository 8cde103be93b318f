-- History retention (issue 21): revisions older than the retention are pruned, a batch at a
-- time. One row: `pruned_through`, the newest pruned revision (revisions after it are kept
-- whole; 0: none pruned), and `swept_through`, how far the sweep that removes their rows has
-- got. Below `pruned_through`, only each resource's last change at or before it (and its
-- variant set) is kept, with its revision row: the state the oldest kept revision starts
-- from. Those rows are not shown as revisions.
CREATE TABLE vxds_retention (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    pruned_through BIGINT NOT NULL,
    swept_through BIGINT NOT NULL
);
INSERT INTO vxds_retention (id, pruned_through, swept_through) VALUES (1, 0, 0);

-- The age limit looks revisions up by commit time.
CREATE INDEX vxds_revisions_by_time ON vxds_revisions (created_at_ms);

-- Each put a revision recorded keeps whether the secret was marked shared (0007), so restoring
-- a past revision brings back its sharing with its variants (issue 22): 1 shared, 0 not, NULL
-- for deletions and for revisions recorded before this column existed.
ALTER TABLE vxds_revision_changes ADD COLUMN shared BIGINT CHECK (shared IN (0, 1));

-- Revisions recorded before: a change at the version the resource still has shares as the
-- resource does now (sharing is part of the version). Older states stay unknown; a restore
-- brings them back unshared, the safe side.
UPDATE vxds_revision_changes SET shared = (
    SELECT r.shared FROM vxds_resources r
    WHERE r.type_url = vxds_revision_changes.type_url
      AND r.name = vxds_revision_changes.name
      AND r.version = vxds_revision_changes.version
) WHERE change <> 'deleted';

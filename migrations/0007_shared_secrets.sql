-- Secrets marked shared (issue 22): with an identity template, a secret is served only through
-- variants bound to the identities they name, unless the operator marks it shared; 1 marks it.
-- (0006 is another change's number; the runner applies whatever is pending, gaps included.)
ALTER TABLE vxds_resources ADD COLUMN shared BIGINT NOT NULL DEFAULT 0 CHECK (shared IN (0, 1));

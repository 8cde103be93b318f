-- Each replica's summary of its connected xDS clients (issue 12, impact preview): per
-- subscribed resource, the parameter sets its streams hold and how many, with sample node ids,
-- as JSON (vxds-core's ClientSummary). Replicas replace their row every few seconds; a row
-- whose expires_at_ms has passed belongs to a replica that stopped publishing and is ignored,
-- then deleted by the next replica that publishes.
CREATE TABLE vxds_client_summaries (
    replica_id TEXT PRIMARY KEY,
    published_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    summary TEXT NOT NULL
);
